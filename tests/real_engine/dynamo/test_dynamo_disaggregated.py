"""The agent against a real disaggregated Dynamo deployment: a prefill mocker and a decode mocker behind
the frontend (KV router), under a load that saturates the decode pool (2 sequences, 8 concurrent long
generations) and leaves the prefill pool idle between 40-word prompts.

Roles: the prefill worker's page says `dynamo_component="prefill"`, which the agent takes as role prefill
(tests/collectors/test_dynamo_recorded.py on this page); Dynamo 1.6.1's decode worker page is the same as
an aggregated worker's, so the decode target gets `role: decode` in the agent's config file
(docs/engines.md "Dynamo in CI"). The mocker's decode page has no batch cap, so it also gets
`batch_max: 2` (its --max-num-seqs).
"""

from __future__ import annotations

import pytest

from dynamo_runs import SHORT_WINDOW
from scrape import select, total

pytestmark = pytest.mark.real_engine


def _during(run, inside: float = 3.0):
    return [(t, a) for t, a in run.agent_pages if run.load.started + inside < t < run.load.ended - 1]


def test_the_pages_say_which_worker_is_which(disagg_run):
    """What Dynamo itself says: the prefill worker's component is `prefill`, the decode worker's
    `backend` with the vllm:* families; the frontend knows each worker's type."""
    prefill, decode = disagg_run.after["prefill"], disagg_run.after["decode"]
    assert select(prefill, "dynamo_component_requests_total", dynamo_component="prefill", dynamo_endpoint="generate")
    assert not [n for (n, _) in prefill if n.startswith("vllm:")]  # the prefill mocker exports no vllm:* families
    assert select(decode, "vllm:num_requests_running")
    assert select(decode, "dynamo_component_requests_total", dynamo_component="backend", dynamo_endpoint="generate")
    fe = disagg_run.after["frontend"]
    assert {dict(ls)["worker_type"] for (n, ls) in fe if n == "dynamo_frontend_worker_active_decode_blocks"} == {
        "prefill", "decode"}
    # every request went through both pools
    n = len(disagg_run.load.ok) + len(disagg_run.deployment.workers)  # + the warm-up requests
    assert total(prefill, "dynamo_component_requests_total", dynamo_endpoint="generate") == n
    assert total(decode, "dynamo_component_requests_total", dynamo_endpoint="generate") == n


def test_decode_pool_saturated_on_its_batch_and_says_so(disagg_run):
    """The decode worker's own page shows the queue (2 running, more waiting); the agent's decode
    target's saturation over a 10 s window inside the load (the mean batch over it against the cap of 2)
    reaches 0.9 with role decode and binding resource batch."""
    dc = disagg_run.target("decode")
    waiting = [total(s, "vllm:num_requests_waiting") for _, s in disagg_run.pages["decode"]]
    assert max(waiting) >= 4, waiting
    saturated = []
    for _, agent in _during(disagg_run, inside=10.5):
        sat = select(agent, "rooflight_saturation_ratio", target=dc, window=SHORT_WINDOW, role="decode")
        binding = [dict(ls)["resource"] for (n, ls), v in agent.items() if n == "rooflight_saturation_binding_info"
                   and ("target", dc) in ls and ("window", SHORT_WINDOW) in ls and v == 1.0]
        if sat and sat[0] >= 0.9:
            saturated.append(binding)
    assert saturated, "the decode target never reached saturation 0.9 during the load"
    assert all(b == ["batch"] for b in saturated), saturated


def test_prefill_pool_not_saturated(disagg_run):
    """The prefill worker finishes each prompt at once: past the load's first burst its own page shows at
    most a couple in flight (each new prompt arrives as a decode slot frees),
    and the agent never calls its target saturated (the prefill mocker's page has no token counters
    or latency histograms, so its prefill_compute and ttft_slo headrooms cannot be computed at all:
    the agent gives it no saturation rather than a made-up one)."""
    pf = disagg_run.target("prefill")
    inflight = [total(s, "dynamo_component_inflight_requests", dynamo_endpoint="generate")
                for t, s in disagg_run.pages["prefill"]
                if disagg_run.load.started + 3 < t < disagg_run.load.ended - 1]  # past the first burst of 8
    assert max(inflight) <= 3, inflight
    for _, agent in _during(disagg_run):
        for v in select(agent, "rooflight_saturation_ratio", target=pf):
            assert v < 0.5, v
        for v in select(agent, "rooflight_headroom_ratio", target=pf):
            assert v > 0.5, v
        running = select(agent, "rooflight_requests_running", target=pf)
        assert running and running[0] <= 3, running


def test_plan_pool_sizing_against_what_the_mocker_sustained(disagg_run):
    """`rooflight plan --from-live --rate R` at the rate this deployment served (its decode pool saturated
    throughout): reported, not asserted beyond a loose bound. The agent's capacities are the roofline's for
    the model it was given (the tiny Llama on the h100-sxm profile), an upper bound the mocker's timing
    model (a full-size model's step times) stays far below; so plan can never ask for more groups than the
    one prefill and one decode worker that sustained it (docs/engines.md "Dynamo in CI")."""
    pools = disagg_run.plan["pools"]
    served_decode = total(disagg_run.after["frontend"], "dynamo_frontend_output_tokens_total") - total(
        disagg_run.before["frontend"], "dynamo_frontend_output_tokens_total")
    wall = disagg_run.load.ended - disagg_run.load.started
    print(f"\n[dynamo plan] rate {disagg_run.sustained_rate:.3f} req/s; mocker decode pool sustained "
          f"{served_decode / wall:.1f} tok/s at batch 2; plan: {pools}")
    assert pools["capacity_source"] == "live"
    assert 1 <= pools["prefill_groups"] <= 1 and 1 <= pools["decode_groups"] <= 1
    assert pools["decode_capacity_per_group"] >= served_decode / wall
