"""The agent against a real Dynamo frontend and one mocker worker, given only their URLs: it recognises
the engine, and its percentiles, phase rates, KV occupancy and request counts equal Dynamo's own.

Interval: the agent's 30 s window at the quiet read (dynamo_runs.py), which starts before the load and ends
after it, so every counter's increase inside it is the whole load's. The agent's span is between its
first and last sample inside the last 30 s: 29.5-30 s at --interval 0.5 when its loop keeps time, one
measured run at 29.0 s on the busy 2-core machine.
"""

from __future__ import annotations

import pytest

from dynamo_runs import WINDOW, WINDOW_S
from scrape import one, sample_gap_near, select, total

pytestmark = pytest.mark.real_engine

MAX_LATE_S = 4.0  # the agent's first sample inside the window, late by a stalled loop at most this


def _delta(run, page: str, name: str) -> float:
    return total(run.after[page], name) - total(run.before[page], name)


def test_agent_recognises_frontend_and_worker_from_urls_alone(agg_run):
    agent = agg_run.agent_after
    for page in ("frontend", "worker"):
        assert one(agent, "rooflight_source_up", source="engine", target=agg_run.target(page)) == 1.0
        engines = {dict(ls).get("engine") for (n, ls) in agent if n == "rooflight_requests_running"
                   and ("target", agg_run.target(page)) in ls}
        assert engines == {"dynamo"}, (page, engines)


def test_counters_equal_the_frontend_counters(agg_run):
    agent, fe = agg_run.agent_after, agg_run.target("frontend")
    assert one(agent, "rooflight_generation_tokens_total", target=fe) == total(
        agg_run.after["frontend"], "dynamo_frontend_output_tokens_total")
    assert one(agent, "rooflight_prompt_tokens_total", target=fe) == total(
        agg_run.after["frontend"], "dynamo_frontend_input_sequence_tokens_sum")
    assert one(agent, "rooflight_kv_cache_capacity_tokens", target=fe) == 128 * 16  # --num-gpu-blocks-override x --block-size
    assert one(agent, "rooflight_batch_max_requests", target=fe) == 8  # --max-num-seqs


def test_phase_rates_equal_the_frontend_counters_and_the_client(agg_run):
    """Both phases share one span, so their rates' ratio is the counters' increases' ratio exactly; each
    rate is the whole load's increase over the agent's span, which is the window (30 s) at most and
    shorter only by a late first sample on the busy cores (26 s allowed)."""
    agent, fe, load = agg_run.agent_after, agg_run.target("frontend"), agg_run.load
    increase = {"decode": _delta(agg_run, "frontend", "dynamo_frontend_output_tokens_total"),
                "prefill": _delta(agg_run, "frontend", "dynamo_frontend_input_sequence_tokens_sum")}
    assert (increase["decode"], increase["prefill"]) == (load.completion_tokens, load.prompt_tokens)
    got = {phase: one(agent, "rooflight_tokens_per_second", phase=phase, window=WINDOW, target=fe)
           for phase in ("prefill", "decode")}
    assert got["prefill"] / got["decode"] == pytest.approx(increase["prefill"] / increase["decode"], rel=1e-9)
    gap = sample_gap_near(agg_run.agent_pages, agent, WINDOW_S, source="engine", target=fe)
    low = WINDOW_S - MAX_LATE_S - max(0.0, gap - 1.0)  # a stall at the window's start: its first sample later
    for phase in ("prefill", "decode"):
        span = increase[phase] / got[phase]
        assert low <= span <= WINDOW_S * (1 + 1e-3), (phase, span, gap)


@pytest.mark.parametrize("key,agent_name", [("ttft", "rooflight_ttft_seconds"), ("itl", "rooflight_itl_seconds")])
def test_frontend_percentiles_equal_prometheus_over_the_same_buckets(agg_run, key, agent_name):
    agent, fe = agg_run.agent_after, agg_run.target("frontend")
    for p in ("50", "90", "99"):
        ours = one(agent, agent_name, percentile=p, window=WINDOW, target=fe)
        theirs = agg_run.prom_queries[f"{key}:{p}"]
        assert theirs is not None, (key, p)
        # Same bucket deltas, same interpolation: only float formatting may differ.
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-9), (key, p)


def _near(pages, t: float, before_s: float = 2.0):
    """The worker pages polled within before_s before t and 0.5 s after (the agent read one of them)."""
    return [s for ts, s in pages if t - before_s <= ts <= t + 1.0]


def test_kv_occupancy_and_requests_equal_the_worker(agg_run):
    """Every agent page during the load: the worker's KV occupancy and running/waiting counts lie within
    what the worker's own page showed around the agent's read (the agent read the worker at some moment
    in between). A request ending just before the next one starts is a transient the 0.5 s poller can
    miss and the agent can catch, so up to 1 page in 5 may fall outside; and the load filled the pool
    visibly (a constant 0 would agree trivially)."""
    wk = agg_run.target("worker")
    seen_kv, checked, outside = [], 0, []
    for t, agent in agg_run.agent_pages:
        if not agg_run.load.started + 1 < t < agg_run.load.ended - 1:
            continue
        near = _near(agg_run.pages["worker"], t)
        if not near:
            continue
        for ours_name, theirs in (("rooflight_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc"),
                                  ("rooflight_requests_running", "vllm:num_requests_running"),
                                  ("rooflight_requests_waiting", "vllm:num_requests_waiting")):
            values = select(agent, ours_name, target=wk)
            assert len(values) == 1, (ours_name, values)
            worker = [total(s, theirs) for s in near]
            if not min(worker) - 1e-9 <= values[0] <= max(worker) + 1e-9:
                outside.append((ours_name, values[0], worker))
        seen_kv.append(one(agent, "rooflight_kv_cache_usage_ratio", target=wk))
        checked += 1
    assert checked >= 10, checked
    assert len(outside) <= checked * 3 / 5, outside  # 3 gauges a page: 1 page in 5
    assert max(seen_kv) >= 0.3, seen_kv  # 6 x ~220 tokens in a 2,048-token pool


def test_frontend_request_counts_equal_its_own(agg_run):
    agent, fe = agg_run.agent_after, agg_run.target("frontend")
    assert one(agent, "rooflight_requests_running", target=fe) == total(agg_run.after["frontend"],
                                                                          "dynamo_frontend_inflight_requests") == 0
    during = [(one(a, "rooflight_requests_running", target=fe), t) for t, a in agg_run.agent_pages
              if agg_run.load.started + 1 < t < agg_run.load.ended - 3]
    assert during and max(r for r, _ in during) == agg_run.deployment.load["concurrency"], during
