"""Detector verdicts on hand-built inputs: each fires on its signature and stays quiet on the near misses."""

from __future__ import annotations

import dataclasses

import pytest

from rooflight.agent.signals.detectors import DetectorInputs, DetectorThresholds, Verdicts, evaluate
from rooflight.agent.signals.detectors.head_of_line import itl_inflation
from rooflight.agent.errors import ConfigError

T = DetectorThresholds()

# A healthy batch: smooth ITL (6 ms steps, the physics' baseline), some prefill, KV half full, no queue.
HEALTHY = DetectorInputs(
    itl_worst_recent=0.008,
    itl_worst_baseline=0.006,
    prefill_tokens_per_step_short=5.0,
    kv_usage=0.5,
    kv_usage_peak_short=0.45,
    preemptions_per_second_short=0.0,
    running=40.0,
    waiting=0.0,
    waiting_min_short=0.0,
    batch_max=256.0,
    held_min_stall=40.0,  # 40 running throughout the last 30 s
    progress_stall=30 * (150 + 2000 + 6000),  # 150 steps, 2,000 decode and 6,000 prompt tokens a second
)

UNKNOWN = DetectorInputs(**{f.name: None for f in dataclasses.fields(DetectorInputs) if f.name != "itl_source"})


def with_(**changes: float | None) -> DetectorInputs:
    return dataclasses.replace(HEALTHY, **changes)


def test_healthy_batch_raises_nothing() -> None:
    v = evaluate(HEALTHY, T)
    assert v == Verdicts(
        head_of_line=False,
        itl_inflation=pytest.approx(0.008 / 0.006),
        itl_source="engine",
        capacity_capped=False,
        admission_bound=False,
        at_configured_max=False,
        engine_stalled=False,
    )


def test_nothing_known_means_cannot_tell() -> None:
    assert evaluate(UNKNOWN, T) == Verdicts(head_of_line=None, itl_inflation=None, itl_source="engine",
                                            capacity_capped=None, admission_bound=None, at_configured_max=None,
                                            engine_stalled=None)


# Head-of-line blocking ------------------------------------------------------------------------------


def test_long_prompt_run_whole_is_head_of_line_blocking() -> None:
    # An 8,000-token prompt run whole: every decode stalls ~260 ms against a 6 ms baseline (~43x;
    # docs/physics.md, section Head-of-line blocking).
    v = evaluate(with_(itl_worst_recent=0.260, prefill_tokens_per_step_short=5.0), T)
    assert v.head_of_line is True
    assert v.itl_inflation == pytest.approx(0.260 / 0.006)


def test_inflation_exactly_at_threshold_fires_and_just_below_does_not() -> None:
    median = 2.0**-7  # exact in binary, so the factor is exactly 3.0
    assert evaluate(with_(itl_worst_baseline=median, itl_worst_recent=3 * median), T).head_of_line is True
    assert evaluate(with_(itl_worst_baseline=median, itl_worst_recent=2.99 * median), T).head_of_line is False


def test_decimal_bucket_edges_at_exactly_the_threshold_fire() -> None:
    # worst ITL in the 0.3 s bucket against a 0.1 s median: 0.3 / 0.1 == 2.9999999999999996 in binary
    assert evaluate(with_(itl_worst_baseline=0.1, itl_worst_recent=0.3), T).head_of_line is True


def test_inflated_tail_while_preempting_is_the_kv_wall_not_head_of_line() -> None:
    # a preempted sequence's next token comes seconds later: the tail inflates at the KV wall too
    stalled = with_(itl_worst_recent=4.0, prefill_tokens_per_step_short=50.0, preemptions_per_second_short=0.5)
    assert evaluate(stalled, T).head_of_line is False
    assert evaluate(with_(itl_worst_recent=0.260, preemptions_per_second_short=None), T).head_of_line is True
    lenient = DetectorThresholds(hol_max_preemptions_per_second=1.0)
    assert evaluate(stalled, lenient).head_of_line is True


def test_inflated_tail_without_prefill_work_is_not_head_of_line() -> None:
    v = evaluate(with_(itl_worst_recent=0.260, prefill_tokens_per_step_short=0.0), T)
    assert v.head_of_line is False
    assert v.itl_inflation == pytest.approx(43.33, rel=1e-3)  # the factor is still exported


def test_prefill_unknown_with_inflated_tail_cannot_tell_but_with_smooth_tail_can() -> None:
    assert evaluate(with_(itl_worst_recent=0.260, prefill_tokens_per_step_short=None), T).head_of_line is None
    assert evaluate(with_(prefill_tokens_per_step_short=None), T).head_of_line is False


def test_zero_median_gives_no_inflation_factor() -> None:
    assert itl_inflation(0.01, 0.0) is None
    assert itl_inflation(None, 0.006) is None
    assert evaluate(with_(itl_worst_baseline=0.0), T).head_of_line is None


def test_absolute_floor_ignores_harmless_jitter() -> None:
    floor = DetectorThresholds(hol_min_itl_seconds=0.05)
    assert evaluate(with_(itl_worst_recent=0.023), T).head_of_line is True  # chunked prefill: ~4x of 6 ms
    assert evaluate(with_(itl_worst_recent=0.023), floor).head_of_line is False
    assert evaluate(with_(itl_worst_recent=0.260), floor).head_of_line is True


# Recorded on a real vLLM (the tiny model on CPU, 2 cores not pinned, load average 12-16; docs/physics.md,
# section Head-of-line blocking): eight streams of ~50-token prompts, 256 tokens each, the agent at 2 Hz.
# Per sample: the worst ITL bucket since the previous sample and its median; the largest step's bucket
# (vLLM's iteration_tokens_total) since the previous sample and the usual largest step (the 60th
# percentile over the seconds that ran a prefill, as the sampler keeps it); prefill per step over 10 s.
# The eight streams finish together and the next eight are admitted in one step: ~400 tokens, the 512
# bucket, is the usual largest step.
QUIET_STALLS = [  # control phase, no long prompt: the host stalled the API server, no step grew
    (0.3, 0.025, 8.0, 512.0, 2.04),  # 12x; only decode steps in the span, no prompt admitted
    (0.3, 0.025, 128.0, 512.0, 1.6),  # 12x; a few prompts admitted
    (0.075, 0.025, 1024.0, 512.0, 1.27),  # 3x; two waves' prompts in one step: one bucket up (2x)
    (0.075, 0.01, 512.0, 512.0, 1.27),  # 7.5x; a wave admitted as usual
]
# A 1,700-token prompt run whole: 5x the ITL, 4x the step; over 10 s, 0.89 prompt tokens a step (under
# the window rule's 1: the step says there was prefill, the average over 10 s does not).
LONG_PROMPT = (0.05, 0.01, 2048.0, 512.0, 0.89)


def recorded(itl: float, itl_median: float, step: float, step_median: float, prefill: float) -> DetectorInputs:
    return with_(itl_worst_recent=itl, itl_worst_baseline=itl_median, step_tokens_largest_recent=step,
                 step_tokens_largest_baseline=step_median, prefill_tokens_per_step_short=prefill)


@pytest.mark.parametrize("sample", QUIET_STALLS)
def test_a_stalled_host_without_a_larger_step_is_not_head_of_line(sample: tuple[float, ...]) -> None:
    v = evaluate(recorded(*sample), T)
    assert v.itl_inflation is not None and v.itl_inflation > 2.999  # the ITL alone flags it (0.075 / 0.025 is 2.9999...)
    assert v.head_of_line is False


def test_a_long_prompt_run_whole_grows_the_largest_step_and_is_head_of_line() -> None:
    v = evaluate(recorded(*LONG_PROMPT), T)
    assert v.head_of_line is True
    assert v.itl_inflation == pytest.approx(5.0)


def test_the_largest_step_must_inflate_as_far_as_hol_step_inflation() -> None:
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=4096.0,
                          step_tokens_largest_baseline=2048.0), T).head_of_line is False  # 2x: one bucket
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=8192.0,
                          step_tokens_largest_baseline=2048.0), T).head_of_line is True  # 4x: the demo's 8,000
    lenient = DetectorThresholds(hol_step_inflation=1.5)
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=4096.0,
                          step_tokens_largest_baseline=2048.0), lenient).head_of_line is True


def test_where_steps_are_told_a_step_far_larger_than_usual_is_the_prefill_the_window_average_misses() -> None:
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=2048.0, step_tokens_largest_baseline=512.0,
                          prefill_tokens_per_step_short=0.0), T).head_of_line is True
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=512.0, step_tokens_largest_baseline=512.0,
                          prefill_tokens_per_step_short=50.0), T).head_of_line is False


def test_without_step_sizes_the_short_window_prefill_alone_judges() -> None:
    """An engine that does not tell its steps' sizes (SGLang, TGI, ...) is judged as before: the same
    quiet stall is flagged there, a limit docs/physics.md states."""
    itl, median, _, _, prefill = QUIET_STALLS[0]
    assert evaluate(with_(itl_worst_recent=itl, itl_worst_baseline=median, prefill_tokens_per_step_short=prefill),
                    T).head_of_line is True


def test_step_sizes_told_but_their_median_unknown_cannot_tell() -> None:
    assert evaluate(with_(itl_worst_recent=0.260, step_tokens_largest_recent=2048.0), T).head_of_line is None
    assert evaluate(with_(step_tokens_largest_recent=2048.0), T).head_of_line is False  # smooth ITL rules it out


# Capacity-capped batch ------------------------------------------------------------------------------

CAPPED = dict(kv_usage=1.0, kv_usage_peak_short=0.97, preemptions_per_second_short=0.8, waiting=4.0, running=3.0)


def test_kv_pinned_preempting_with_queue_is_capacity_capped() -> None:
    v = evaluate(with_(**CAPPED), T)
    assert v.capacity_capped is True
    assert v.admission_bound is False  # KV has no room
    assert v.at_configured_max is False


@pytest.mark.parametrize(
    "miss",
    [
        {"kv_usage_peak_short": 0.94},  # never reached the wall during the window
        {"preemptions_per_second_short": 0.0},  # full but not preempting: a well-packed batch
        {"waiting": 0.0},  # nobody is being held back
    ],
)
def test_capacity_capped_near_misses(miss: dict[str, float]) -> None:
    assert evaluate(with_(**{**CAPPED, **miss}), T).capacity_capped is False


def test_capacity_capped_fires_at_exactly_the_kv_wall_and_the_queue_floor() -> None:
    # Both bounds are "at least": a peak of exactly 0.95 is the wall, one request waiting is a queue.
    assert (T.capacity_kv_usage, T.capacity_min_waiting) == (0.95, 1.0)
    assert evaluate(with_(**{**CAPPED, "kv_usage_peak_short": 0.95}), T).capacity_capped is True
    assert evaluate(with_(**{**CAPPED, "waiting": 1.0}), T).capacity_capped is True
    assert evaluate(with_(**{**CAPPED, "kv_usage_peak_short": 0.95, "waiting": 1.0}), T).capacity_capped is True
    # and just under each edge it does not
    assert evaluate(with_(**{**CAPPED, "kv_usage_peak_short": 0.9499}), T).capacity_capped is False
    assert evaluate(with_(**{**CAPPED, "waiting": 0.999}), T).capacity_capped is False


def test_capacity_capped_needs_preemptions_strictly_above_the_floor() -> None:
    floor = DetectorThresholds(capacity_min_preemptions_per_second=0.5)
    assert evaluate(with_(**{**CAPPED, "preemptions_per_second_short": 0.5}), floor).capacity_capped is False
    assert evaluate(with_(**{**CAPPED, "preemptions_per_second_short": 0.5001}), floor).capacity_capped is True


def test_capacity_capped_without_preemption_counter_cannot_tell() -> None:
    assert evaluate(with_(**{**CAPPED, "preemptions_per_second_short": None}), T).capacity_capped is None


# Admission-bound batch ------------------------------------------------------------------------------

ADMISSION = dict(waiting=12.0, waiting_min_short=8.0, running=20.0, batch_max=256.0, kv_usage=0.3)


def test_queue_with_room_everywhere_is_admission_bound() -> None:
    v = evaluate(with_(**ADMISSION), T)
    assert v.admission_bound is True
    assert v.capacity_capped is False
    assert v.at_configured_max is False


@pytest.mark.parametrize(
    "miss",
    [
        {"waiting_min_short": 0.0},  # the queue drained during the window: a blip
        {"running": 128.0},  # exactly half the cap is not "well below"
        {"kv_usage": 0.8},  # KV has no room left by the definition
    ],
)
def test_admission_bound_near_misses(miss: dict[str, float]) -> None:
    assert evaluate(with_(**{**ADMISSION, **miss}), T).admission_bound is False


def test_admission_bound_without_a_known_cap_cannot_tell() -> None:
    # vLLM does not expose max_num_seqs: without it "well below the cap" is unknowable.
    assert evaluate(with_(**{**ADMISSION, "batch_max": None}), T).admission_bound is None
    assert evaluate(with_(**{**ADMISSION, "batch_max": 0.0}), T).admission_bound is None


# Batch at its configured maximum --------------------------------------------------------------------


def test_running_at_cap_with_kv_room_is_a_config_lever() -> None:
    v = evaluate(with_(running=256.0, batch_max=256.0, kv_usage=0.4, waiting=30.0, waiting_min_short=25.0), T)
    assert v.at_configured_max is True
    assert v.admission_bound is False
    assert v.capacity_capped is False


def test_at_configured_max_near_misses() -> None:
    assert evaluate(with_(running=255.0, batch_max=256.0, kv_usage=0.4), T).at_configured_max is False
    assert evaluate(with_(running=256.0, batch_max=256.0, kv_usage=0.85), T).at_configured_max is False
    assert evaluate(with_(running=256.0, batch_max=None, kv_usage=0.4), T).at_configured_max is None


# Thresholds ------------------------------------------------------------------------------------------


def test_thresholds_are_configurable() -> None:
    strict = DetectorThresholds(hol_inflation=50.0, capacity_kv_usage=0.99)
    assert evaluate(with_(itl_worst_recent=0.260), strict).head_of_line is False
    assert evaluate(with_(**CAPPED), strict).capacity_capped is False


@pytest.mark.parametrize(
    "bad",
    [
        {"hol_inflation": 1.0},
        {"hol_step_inflation": 0.5},
        {"capacity_kv_usage": 0.0},
        {"kv_room_usage": 1.5},
        {"admission_max_batch_fraction": -0.1},
        {"capacity_min_waiting": -1.0},
        {"hol_min_prefill_tokens_per_step": float("nan")},
    ],
)
def test_nonsense_thresholds_are_config_errors(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        DetectorThresholds(**bad)


# Engine stalled ---------------------------------------------------------------------------------------

def test_requests_held_and_nothing_moved_is_a_stalled_engine() -> None:
    # 8 running and 20 waiting through the last 30 s, not one step or token: hung
    assert evaluate(with_(held_min_stall=28.0, progress_stall=0.0), T).engine_stalled is True


def test_a_slow_engine_or_an_idle_one_is_not_stalled() -> None:
    # one token in 30 s is slow, not hung; nothing held is idle, whatever the counters do
    assert evaluate(with_(held_min_stall=28.0, progress_stall=1.0), T).engine_stalled is False
    assert evaluate(with_(held_min_stall=0.0, progress_stall=0.0), T).engine_stalled is False


def test_a_stall_unknown_until_the_history_covers_the_window() -> None:
    assert evaluate(with_(held_min_stall=None, progress_stall=0.0), T).engine_stalled is None
    assert evaluate(with_(held_min_stall=28.0, progress_stall=None), T).engine_stalled is None
    assert evaluate(with_(held_min_stall=0.0, progress_stall=None), T).engine_stalled is False  # idle rules it out
    with pytest.raises(ConfigError):
        DetectorThresholds(stall_seconds=-1.0)
