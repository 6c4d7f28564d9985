"""What caps the batch, on a real vLLM: the configured maximum (queue setup) or the KV wall (kvwall).

queue:  --max-num-seqs 4 and 12 concurrent requests: 4 run, the rest wait, the KV cache (1 GiB,
        a million tokens) is nearly empty, so the agent (run with --batch-max 4) must say "at the
        configured max" and never "capacity-capped".
kvwall: a 1,280-token KV cache and 8 concurrent 600-token requests: the cache fills, vLLM preempts,
        so the agent must say "capacity-capped" with a non-zero preemption rate.
The agent's pages were polled every 0.5 s during the load; vLLM's too, as the witness.
"""

from __future__ import annotations

import pytest

from scrape import select, total

pytestmark = pytest.mark.real_engine


def _series(obs, name: str, **labels: str) -> list[float]:
    """Every value the agent showed for name during the run (all label sets matching)."""
    if obs.agent_error is not None:
        raise AssertionError(obs.agent_error)
    return [v for _, page in obs.agent_pages for v in select(page, name, **labels)]


def test_queue_setup_really_queued(queue_run):
    waiting = [total(p, "vllm:num_requests_waiting") for _, p in queue_run.vllm_pages]
    running = [total(p, "vllm:num_requests_running") for _, p in queue_run.vllm_pages]
    assert max(waiting) > 0 and max(running) == 4


def test_queue_setup_is_at_configured_max_not_kv_wall(queue_run):
    assert 1.0 in _series(queue_run, "rooflight_batch_at_configured_max")
    assert max(_series(queue_run, "rooflight_requests_waiting")) > 0
    assert 1.0 not in _series(queue_run, "rooflight_batch_capacity_capped")
    assert max(_series(queue_run, "rooflight_kv_cache_usage_ratio")) < 0.5


def test_kvwall_setup_really_preempted(kvwall_run):
    """What the setup guarantees: vLLM ran with the 10-block pool, and it preempted. vLLM preempts a
    running request only when the pool cannot give it its next block, so a rising counter is the proof
    that the cache was full. The full moment itself is not something a 0.5 s poll can promise to see:
    one of the 10 blocks is vLLM's null block, so usage moves in ninths, a full pool lasts about one
    engine step, and a resumed request (recomputing its whole prefix) can hold admission back while
    6-8 of the 9 blocks are in use. A run that saw at most 8/9 = 0.889 failed a `>= 0.9` here."""
    preempted = total(kvwall_run.vllm_after, "vllm:num_preemptions_total") - total(
        kvwall_run.vllm_before, "vllm:num_preemptions_total")
    assert preempted > 0
    assert select(kvwall_run.vllm_after, "vllm:cache_config_info", num_gpu_blocks="10"), \
        "vLLM did not run with the 10-block KV cache (--num-gpu-blocks-override 10)"
    usage = [total(p, "vllm:kv_cache_usage_perc") for _, p in kvwall_run.vllm_pages]
    # 8 clients each growing to 6 blocks (~90 + 600 tokens of 128) keep at least 6 of the 9 usable blocks
    # in use for most of the load; any one poll of that stretch shows it
    assert max(usage) >= 6 / 9 - 1e-9, f"KV usage seen during the load: {sorted(set(usage))}"


def test_kvwall_setup_is_capacity_capped_with_preemptions(kvwall_run):
    assert 1.0 in _series(kvwall_run, "rooflight_batch_capacity_capped")
    assert max(_series(kvwall_run, "rooflight_preemptions_per_second", window="10s")) > 0
    assert 1.0 not in _series(kvwall_run, "rooflight_batch_at_configured_max")
    agent_total = total(kvwall_run.agent(), "rooflight_preemptions_total")
    assert agent_total == total(kvwall_run.vllm_after, "vllm:num_preemptions_total")
