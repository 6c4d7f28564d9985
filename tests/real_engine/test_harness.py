"""The harness itself, against the real vLLM and a real Prometheus, without the agent.

If these fail, the agent checks cannot be trusted: the load generator must count exactly what vLLM
counts, the Prometheus stand-in must interpolate exactly as our reference does, and every process
must be gone (ports free, vLLM's per-start TMPDIR removed) once a setup is over.
"""

from __future__ import annotations

import math

import pytest

from procs import port_is_free
from scrape import bucket_delta, reference_quantile, total

pytestmark = pytest.mark.real_engine


def _delta(obs, name: str) -> float:
    return total(obs.vllm_after, name) - total(obs.vllm_before, name)


def test_every_request_streamed_its_tokens(normal_run):
    load = normal_run.load
    spec = load.spec
    assert len(load.ok) == spec.requests, load.summary()
    assert load.completion_tokens == spec.requests * spec.max_tokens  # ignore_eos
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in load.ok)
    assert all(len(r.itl_s) == spec.max_tokens - 1 for r in load.ok)


def test_client_usage_equals_vllm_counter_deltas(normal_run):
    assert _delta(normal_run, "vllm:generation_tokens_total") == normal_run.load.completion_tokens
    assert _delta(normal_run, "vllm:prompt_tokens_total") == normal_run.load.prompt_tokens
    assert _delta(normal_run, "vllm:time_to_first_token_seconds_count") == normal_run.setup.load["requests"]


def test_prometheus_interpolates_like_the_reference(normal_run):
    for key, metric in (("ttft", "vllm:time_to_first_token_seconds"),
                        ("itl", "vllm:inter_token_latency_seconds")):
        delta = bucket_delta(normal_run.vllm_after, normal_run.vllm_before, metric)
        for p in ("50", "90", "99"):
            ours = reference_quantile(int(p) / 100, delta)
            theirs = normal_run.prom_queries[f"{key}:{p}"]
            assert ours is not None and theirs is not None, (key, p, delta)
            assert math.isclose(ours, theirs, rel_tol=1e-9), (key, p, ours, theirs)


def test_prometheus_counter_deltas_match_direct_reads(normal_run):
    for counter in ("vllm:generation_tokens_total", "vllm:estimated_flops_per_gpu_total"):
        assert normal_run.prom_queries[counter] == pytest.approx(_delta(normal_run, counter), rel=1e-9)
    assert _delta(normal_run, "vllm:estimated_flops_per_gpu_total") > 0  # --enable-mfu-metrics took


def test_setup_left_nothing_behind(normal_run):
    for proc in normal_run.processes:
        assert proc.leftovers() == [], proc.name
        assert port_is_free(proc.port), (proc.name, proc.port)
        if proc.tmpdir is not None:
            assert not proc.tmpdir.exists(), proc.tmpdir
