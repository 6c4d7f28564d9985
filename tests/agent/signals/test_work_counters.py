"""The work counters (rooflight_model_streamed_bytes_total, rooflight_model_flops_total): what the recording
rules rate into MBU and MFU must be what the agent's own ratios count, sample by sample (derive.accumulate_work).
H100 SXM: 3.35e12 B/s, 989e12 dense bf16 FLOP/s."""

from __future__ import annotations

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.signals import derive
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.samples import EngineSeries, Histogram

H100 = get_profile("h100-sxm")
BW, PEAK = 3.35e12, 989e12


def _constants(model: str) -> TargetConstants:
    return TargetConstants(model=preset(model), gpu=H100, gpu_source="flag")


def _series(t: float, steps: float, decode: float, prompt: float, prompts: float, running: float,
            kv: float) -> EngineSeries:
    """The engine's page at second `t` of a steady load: per second `steps` steps, `decode` generated and
    `prompt` prompt tokens of `prompts` requests (each its first token: a TTFT observation)."""
    return EngineSeries(model="m", running=running, kv_usage_ratio=kv, kv_capacity_tokens=100_000.0,
                        prompt_tokens_total=prompt * t, generation_tokens_total=decode * t, steps_total=steps * t,
                        ttft=Histogram(buckets=((float("inf"), prompts * t),), count=prompts * t, sum=0.1 * prompts * t),
                        prompt_length=Histogram(buckets=((float("inf"), prompts * t),), count=prompts * t,
                                                sum=prompt * t))


def _run(constants: TargetConstants, pages: list[tuple[float, EngineSeries]]) -> tuple[
        list[derive.WorkTotals], list[derive.WindowValues | None]]:
    """Sample the pages in order as the engine loop does: append, derive the 10 s window, count the work."""
    history = SeriesHistory(120.0)
    totals: derive.WorkTotals | None = None
    out, windows = [], []
    for t, page in pages:
        history.append(t, *derive.history_inputs(page))
        window = derive.derive_window(history, "10s", 10.0, constants, page.kv_capacity_tokens, ("50",))
        interval = history.last_interval()
        if interval is not None:
            totals = derive.accumulate_work(totals, *interval, window)
            out.append(totals)
        windows.append(window)
    return out, windows


@pytest.mark.parametrize("model, load", [
    ("llama-3-8b", (145.0, 2000.0, 6000.0, 3.0, 16.0, 0.4)),
    ("mixtral-8x7b", (20.0, 40.0, 100.0, 1.0, 2.0, 0.1)),
])
def test_the_counters_rate_to_the_agents_own_ratios(model: str, load: tuple[float, ...]) -> None:
    # A steady load (Llama-3-8B: 145 steps/s of 16 sequences, 2,000 generated and 6,000 prompt tokens/s of 3
    # prompts, KV 40% full; Mixtral: 20 steps/s of 7 tokens, 2 of them decode). Over any stretch, counter
    # increase / seconds / peak is the window's MBU and MFU (to float rounding): the numerators are the
    # ratios', whatever the model counts (embedding rows, the experts a step's tokens touch, attention over
    # each sequence's cache and each prompt's triangle).
    c = _constants(model)
    pages = [(float(t), _series(t, *load)) for t in range(0, 31)]
    totals, windows = _run(c, pages)
    last = windows[-1]
    assert last is not None and last.mbu is not None
    a, b = totals[9], totals[-1]  # the totals after seconds 10 and 30
    assert b.streamed_bytes is not None and a.streamed_bytes is not None
    assert (b.streamed_bytes - a.streamed_bytes) / 20.0 / BW == pytest.approx(last.mbu, rel=1e-9)
    for phase in ("prefill", "decode"):
        assert (b.flops[phase] - a.flops[phase]) / 20.0 / PEAK == pytest.approx(last.mfu[phase], rel=1e-9)
    # Llama-3-8B by hand: a step reads 15,010,301,316 B of weights (the 1.05e9 B input table left out but
    # for 55.17 rows of 8,192 B) + 0.4 x 100,000 x 131,072 = 5,242,880,000 B of KV: x 145 / 3.35e12 = 0.8766.
    if model == "llama-3-8b":
        assert round(last.mbu, 4) == 0.8766
        assert (b.streamed_bytes - a.streamed_bytes) / 20.0 == pytest.approx(20_253_181_316 * 145, rel=1e-9)


def test_the_counters_follow_the_steps_that_ran() -> None:
    # The engine idles 20 s, then runs 100 steps/s of one sequence for 5 s: the 10 s window's MBU is half
    # the burst's (it spans 5 idle seconds), but the bytes counted are the 500 steps' own, each 15,009,857,536 B
    # (Llama-3-8B at one token a step, empty cache): the counters follow the work as it happens.
    c = _constants("llama-3-8b")
    pages = [(float(t), _series(0, 0, 0, 0, 0, 0.0, 0.0)) for t in range(0, 21)]
    pages += [(20.0 + t, _series(t, 100.0, 100.0, 0.0, 0.0, 1.0, 0.0)) for t in range(1, 6)]
    totals, windows = _run(c, pages)
    assert totals[-1].streamed_bytes == pytest.approx(500 * 15_009_857_536, rel=1e-9)
    assert totals[-1].flops["decode"] == pytest.approx(500 * 2 * 7_504_924_672, rel=1e-9)
    assert totals[-1].flops["prefill"] == 0.0  # present from the start, at 0: a rate() over it reads 0
    last = windows[-1]
    assert last is not None and last.mbu == pytest.approx(500 * 15_009_857_536 / 10.0 / BW, rel=1e-9)


def test_a_sample_counted_twice_adds_nothing_and_totals_never_fall() -> None:
    c = _constants("llama-3-8b")
    pages = [(float(t), _series(t, 145.0, 2000.0, 6000.0, 3.0, 16.0, 0.4)) for t in range(0, 12)]
    totals, _ = _run(c, pages)
    counted = [t for t in totals if t.streamed_bytes is not None]  # from the first window on (half its span)
    assert len(counted) >= 5
    for before, after in zip(counted, counted[1:]):
        assert after.streamed_bytes is not None
        assert after.streamed_bytes >= (before.streamed_bytes or 0.0)
        assert all(after.flops[p] >= before.flops.get(p, 0.0) for p in after.flops)
    history = SeriesHistory(120.0)
    for t, page in pages:
        history.append(t, *derive.history_inputs(page))
    window = derive.derive_window(history, "10s", 10.0, c, 100_000.0, ("50",))
    interval = history.last_interval()
    assert interval is not None
    once = derive.accumulate_work(None, *interval, window)
    assert derive.accumulate_work(once, *interval, window) == once


def test_work_whose_ratio_is_withheld_is_not_counted() -> None:
    # 10,000 steps/s of Llama-3-8B would read 45x the H100's bandwidth: the MBU is withheld as impossible
    # (derive.MAX_UTILIZATION), and so is its numerator: the bytes counter stays where it was.
    c = _constants("llama-3-8b")
    pages = [(float(t), _series(t, 10_000.0, 10_000.0, 0.0, 0.0, 1.0, 0.0)) for t in range(0, 12)]
    totals, windows = _run(c, pages)
    assert windows[-1] is not None and windows[-1].mbu is None
    assert windows[-1].streamed_bytes_per_second is None
    assert all(t.streamed_bytes is None for t in totals)


def test_without_a_model_nothing_is_counted() -> None:
    c = TargetConstants(model=None, gpu=H100, gpu_source="flag")
    pages = [(float(t), _series(t, 145.0, 2000.0, 6000.0, 3.0, 16.0, 0.4)) for t in range(0, 12)]
    totals, _ = _run(c, pages)
    assert totals[-1].streamed_bytes is None and not totals[-1].flops
