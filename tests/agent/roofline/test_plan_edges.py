"""rooflight plan at edges nothing else guards; each expectation is worked by hand
in the comments (docs/physics.md)."""

from __future__ import annotations

import pytest

from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline.plan import build_plan, build_pool_plan, physics_capacities, shared_groups_for


def test_tp_all_reduces_on_a_pcie_gpu_pay_pcies_latency_and_bandwidth() -> None:
    # 70B at TP4 on L40S (PCIe only): 2 all-reduces x 80 layers, each 25 us + 2 x 3/4 x payload / 25 GB/s.
    # Batch 128: payload 128 x 8,192 x 2 B = 2,097,152 B -> 125.8 us, so 160 x 150.8 us = 24.1 ms a step
    # (NVLink's 5 us + 450 GB/s would say 1.92 ms: a TP4 L40S decode step 12x cheaper than it is).
    plan = build_plan(preset("llama-3-70b"), get_profile("l40s"), tp=4, context_tokens=8000, batch=128,
                      prompt_tokens=2048)
    assert plan.tp_allreduce_seconds_at_batch == pytest.approx(160 * (25e-6 + 1.5 * 2_097_152 / 25e9))
    assert round(plan.tp_allreduce_seconds_at_batch * 1e3, 1) == 24.1


def test_the_h100_pcie_all_reduces_over_pcie_gen5() -> None:
    # H100 PCIe is a PCIe Gen5 x16 card (datasheet: 128 GB/s, 64 each way; Gen4's 64 / 32): at the Gen4 profile's
    # 25 of 32 GB/s one way, 50 GB/s. 70B at TP4, a 2,048-token prompt: 2,048 x 8,192 x 2 B = 33,554,432 B, so
    # 160 x (25 us + 1.5 x 33,554,432 / 50e9) = 165 ms of all-reduces (326 ms at Gen4's 25 GB/s).
    plan = build_plan(preset("llama-3-70b"), get_profile("h100-pcie"), tp=4, context_tokens=8000, batch=1,
                      prompt_tokens=2048)
    assert plan.link == "PCIe Gen5"
    assert plan.prefill_tp_allreduce_seconds == pytest.approx(160 * (25e-6 + 1.5 * 33_554_432 / 50e9))
    assert round(plan.prefill_tp_allreduce_seconds * 1e3) == 165
    a100 = build_plan(preset("llama-3-70b"), get_profile("a100-pcie-80gb"), tp=4, context_tokens=8000, batch=1,
                      prompt_tokens=2048)
    assert round(a100.prefill_tp_allreduce_seconds * 1e3) == 326  # a Gen4 card keeps 25 GB/s


def test_a_shared_pool_prefills_in_the_time_its_decodes_leave() -> None:
    # 1 request/s, a prompt's prefill 0.1 s on an idle group, and 3.5 groups' worth of decode to share out, at
    # a 0.5 s TTFT target. 4 groups spend 3.5 / 4 = 87.5% of their time decoding, so a prefill stretches to
    # 0.1 / 0.125 = 0.8 s, past the target whatever the queue. 5 groups: 0.1 / 0.3 = 0.333 s, and the M/M/5
    # queue at 1 x 0.333 = 0.33 Erlangs (7% busy) waits past the remaining 0.167 s far under 1% of the time:
    # 5 groups. (On prefill time alone, 4 groups would do.)
    assert shared_groups_for(1.0, 0.1, 3.5, 0.5) == 5


def test_one_pool_under_a_groups_work_is_reason_enough_to_share() -> None:
    # 4 req/s of 2,000 prompt + 2,500 output tokens at 10,000 prefill and 2,500 decode tok/s a group: the
    # prefill pool would carry 4 x 2,000 / 10,000 = 0.8 of one group's work, the decode pool 4 x 2,500 / 2,500
    # = 4. A prompt's 0.2 s prefill is past the 50 ms ITL budget, but a prefill pool with under one group's
    # work idles part of its GPUs: share (either pool under one group is reason enough, not both).
    p = build_pool_plan(4, 2000, 2500, 10_000, 2_500)
    assert p.share is True
    assert any("too small a fleet" in r for r in p.reasons) and not any("within" in r for r in p.reasons)


def test_a_tp_groups_decode_capacity_pays_its_all_reduces() -> None:
    # Llama-3-70B at TP 4 on H100, one sequence of 100 + 100 tokens (a mean live context of 150): a step
    # reads 141,107,412,992 weight bytes but the input table's 2,101,346,304, of which a row (16,384 B), + 150 x
    # 327,680 KV bytes at 0.7 x 4 x 3.35e12 B/s = 14.825 ms (its compute, 2 x 69.5e9 / (0.5 x 4 x 989e12) =
    # 70 us, is under it), plus 160 all-reduces of one token's 8,192 x 2 B activations: 160 x (5 us + 1.5 x
    # 16,384 / 450e9) = 0.809 ms. 1 / 15.634 ms = 63.97 tok/s a group (67.45 without the all-reduces).
    _, decode, batch, _, _ = physics_capacities(preset("llama-3-70b"), get_profile("h100-sxm"), tp=4,
                                                prompt_tokens=100, output_tokens=100, batch_max=1, prefill_mfu=0.5,
                                                decode_mbu=0.7, reserved_bytes_per_gpu=4e9)
    memory = (141_107_412_992 - 2_101_346_304 + 16_384 + 150 * 327_680) / (0.7 * 4 * 3.35e12)
    assert batch == 1
    assert decode == pytest.approx(1 / (memory + 160 * (5e-6 + 1.5 * 16_384 / 450e9)))
    assert round(decode, 2) == 63.97


def test_a_shared_pools_queue_may_wait_only_what_the_prefill_leaves_of_the_ttft() -> None:
    # 12 prompts/s, each 0.2 s of prefill on a group with no decode: 2.4 Erlangs, a 0.5 s p99 TTFT, so a
    # prompt may queue 0.3 s. Erlang C for 4 groups: a^4/4! x 4/(4 - 2.4) = 3.456 over 1 + 2.4 + 2.88 + 2.304
    # + 3.456 = 12.04: 0.287; P(wait > 0.3 s) = 0.287 x e^-((20 - 12) x 0.3) = 0.026, past 1%. 5 groups: 0.1135
    # x e^-(13 x 0.3) = 0.0023: 5 groups. (Letting the queue wait the whole 0.5 s: 0.287 x e^-4 = 0.005, 4.)
    assert shared_groups_for(12.0, 0.2, 0.0, 0.5) == 5
