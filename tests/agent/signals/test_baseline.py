"""TailBaseline keeps one value a second over its span and gives their median once they span min_span;
the median it keeps between adds must be the median of what it holds after every add."""

from __future__ import annotations

import random
import statistics

import pytest

from rooflight.agent.signals.baseline import TailBaseline


@pytest.mark.parametrize("seed", range(10))
def test_the_median_is_always_that_of_the_values_held(seed: int) -> None:
    rng = random.Random(seed)
    tail, held, t = TailBaseline(keep_seconds=30.0, min_span=5.0), [], 0.0
    for _ in range(600):
        t += rng.choice((0.1, 0.1, 0.5, 1.0, 3.0))
        value = rng.choice((None, rng.uniform(0, 1)))
        tail.add(t, value)
        if value is not None and (not held or t - held[-1][0] >= 1.0):
            held.append((t, value))
            held = [(at, v) for at, v in held if at >= t - 30.0]  # the old ones go when a new one comes
        expected = statistics.median(v for _, v in held) if held and held[-1][0] - held[0][0] >= 5.0 else None
        assert tail.median() == expected
        assert tail.median() == expected  # asked again without an add: the same
        assert len(tail) == len(held)
