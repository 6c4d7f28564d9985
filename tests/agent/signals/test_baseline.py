"""TailBaseline keeps one value a second over its span and gives their median once they span min_span;
the median it keeps between adds must be the median of what it holds after every add."""

from __future__ import annotations

import random
import statistics

import pytest

from rooflight.agent.signals.baseline import KEEP_EVERY_SHARE, TailBaseline


def test_one_hz_samples_a_millisecond_early_are_all_kept() -> None:
    """The sampler runs on a 1 s grid, and each sample's time jitters around it: a value 0.999 s after
    the last is the next second's, not a second one in the same second (a strict 1 s kept one in two)."""
    rng = random.Random(7)
    tail = TailBaseline(keep_seconds=300.0, min_span=30.0)
    for i in range(100):
        tail = tail.add(i + rng.uniform(-0.05, 0.05), 1.0)
    assert len(tail) == 100
    for i in range(100, 110):  # 10 Hz: about one value a second, not ten
        for tenth in range(10):
            tail = tail.add(i + tenth / 10, 1.0)
    assert 100 + 10 <= len(tail) <= 100 + 14


@pytest.mark.parametrize("seed", range(10))
def test_the_median_is_always_that_of_the_values_held(seed: int) -> None:
    rng = random.Random(seed)
    tail, held, t = TailBaseline(keep_seconds=30.0, min_span=5.0), [], 0.0
    for _ in range(600):
        t += rng.choice((0.1, 0.1, 0.5, 1.0, 3.0))
        value = rng.choice((None, rng.uniform(0, 1)))
        tail = tail.add(t, value)
        if value is not None and (not held or t - held[-1][0] >= KEEP_EVERY_SHARE * 1.0):
            held.append((t, value))
            held = [(at, v) for at, v in held if at >= t - 30.0]  # the old ones go when a new one comes
        expected = statistics.median(v for _, v in held) if held and held[-1][0] - held[0][0] >= 5.0 else None
        assert tail.median() == expected
        assert tail.median() == expected  # asked again without an add: the same
        assert len(tail) == len(held)


def test_a_quantile_gives_the_lowest_value_with_that_share_at_or_under_it() -> None:
    """The largest step's baseline (0.6): bucket bounds stay bucket bounds, and a mixture of seconds with
    and without a wave of admissions (64 and 512 tokens, about even) reads the wave, where the median
    would flip between them (docs/physics.md, section Head-of-line blocking)."""
    tail = TailBaseline(keep_seconds=60.0, min_span=5.0, quantile=0.6)
    for t, value in enumerate([64.0, 512.0] * 5):  # ten values: the 6th lowest is the first 512
        tail = tail.add(float(t), value)
    assert tail.median() == 512.0
    tail = tail.add(10.0, 64.0)  # eleven: 6 of 64, 5 of 512; ceil(0.6 x 11) = 7th lowest
    assert tail.median() == 512.0
    half = TailBaseline(keep_seconds=60.0, min_span=5.0)
    for t, value in enumerate([64.0, 512.0] * 5 + [64.0]):
        half = half.add(float(t), value)
    assert half.median() == 64.0


def test_a_quantile_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError):
        TailBaseline(keep_seconds=60.0, min_span=5.0, quantile=1.0)


def test_add_gives_a_new_baseline_and_leaves_the_old_one_as_it_was() -> None:
    """A detector's state is a value: the baseline a sample judged against stays what it was."""
    before = TailBaseline(keep_seconds=60.0, min_span=2.0)
    for t in range(3):
        before = before.add(float(t), float(t + 1))
    after = before.add(3.0, 10.0)
    assert (len(before), before.median()) == (3, 2.0)
    assert (len(after), after.median()) == (4, 2.5)
    assert after.add(3.5, 100.0) is after  # under a second after the last kept: dropped
    assert after.add(5.0, None) is after
