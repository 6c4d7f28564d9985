"""The ITL tail's own recent median: what "inflated" is measured against.

A workload without chunked prefill always has a tail (every admitted prompt stretches one step), so p99
against p50 would flag steady traffic. Against the median of its own recent values, the p99 tail only
inflates when something new happens: one long prompt prefilled whole, say. One value per second is
kept; the median is given once the values span `min_span` seconds, so a cold start flags nothing.

A `quantile` other than the median gives the value that share of them stay at or under (the lowest
held value with at least that share at or below it: a bucket bound stays a bucket bound). The
head-of-line detector's largest step uses 0.6: where streams finish together, the seconds that
admitted a wave of prompts and those that did not are about even, and a median flips between them.

A value, not an object that changes: `add` gives the baseline with the value in it (the baseline itself
when the value is dropped), so a detector's state is passed in and returned (signals/policy.py). The
quantile is taken when a value is kept, once a second, not on each of the ten asks a second at 10 Hz.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TailBaseline:
    keep_seconds: float
    min_span: float
    every: float = 1.0
    quantile: float = 0.5
    values: tuple[tuple[float, float], ...] = ()  # (time, value), oldest first, at least `every` apart
    _median: float | None = field(default=None, repr=False)  # the quantile of `values`, taken when they change

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1) (got {self.quantile})")

    def add(self, t: float, value: float | None) -> TailBaseline:
        """The baseline with `value` at `t` kept, and the values older than `keep_seconds` gone; itself
        for no value, or for one under `every` after the last kept."""
        if value is None or (self.values and t - self.values[-1][0] < self.every):
            return self
        oldest = t - self.keep_seconds
        values = tuple(v for v in (*self.values, (t, value)) if v[0] >= oldest)
        return TailBaseline(self.keep_seconds, self.min_span, self.every, self.quantile, values,
                            _quantile_of(values, self.min_span, self.quantile))

    def median(self) -> float | None:
        """The quantile of the values held (their median by default); None until they span `min_span`."""
        return self._median

    def __len__(self) -> int:
        return len(self.values)


def _quantile_of(values: tuple[tuple[float, float], ...], min_span: float, quantile: float) -> float | None:
    if not values or values[-1][0] - values[0][0] < min_span:
        return None
    if quantile == 0.5:
        return statistics.median(v for _, v in values)
    ordered = sorted(v for _, v in values)
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]
