"""The ITL tail's own recent median: what "inflated" is measured against.

A workload without chunked prefill always has a tail (every admitted prompt stretches one step), so p99
against p50 would flag steady traffic. Against the median of its own recent values, the p99 tail only
inflates when something new happens: one long prompt prefilled whole, say. One value per second is
kept; the median is given once the values span `min_span` seconds, so a cold start flags nothing.

A `quantile` other than the median gives the value that share of them stay at or under (the lowest
held value with at least that share at or below it: a bucket bound stays a bucket bound). The
head-of-line detector's largest step uses 0.8: where streams finish together, the seconds that
admitted a wave of prompts and those that did not are about even, and a median flips between them;
on a shared host the waves' share drifts (56% of the prefill seconds in one run), and a quantile just
above it flips too.

A value, not an object that changes: `add` gives the baseline with the value in it (the baseline itself
when the value is dropped), so a detector's state is passed in and returned (signals/policy.py). The
quantile is taken when a value is kept, once a second, not on each of the ten asks a second at 10 Hz.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


# A value is kept once this share of `every` has passed since the last kept: at 1 Hz the sampler's jitter
# puts half the intervals a millisecond under 1 s, and a strict `every` kept one value in two.
KEEP_EVERY_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class TailBaseline:
    keep_seconds: float
    min_span: float
    every: float = 1.0
    quantile: float = 0.5
    times: tuple[float, ...] = ()  # when each value held was kept, oldest first, about `every` apart
    values: tuple[float, ...] = ()  # the values held, in the same order
    ordered: tuple[float, ...] = field(default=(), repr=False)  # the same values, sorted
    _median: float | None = field(default=None, repr=False)  # the quantile of `values`, taken when they change

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1) (got {self.quantile})")

    def add(self, t: float, value: float | None) -> TailBaseline:
        """The baseline with `value` at `t` kept, and the values older than `keep_seconds` gone; itself
        for no value, or for one under KEEP_EVERY_SHARE x `every` after the last kept. The sorted values
        are kept sorted (at 1 Hz a value is kept on every sample: no sort of up to `keep_seconds` values
        each time)."""
        times = self.times
        if value is None or (times and t - times[-1] < KEEP_EVERY_SHARE * self.every):
            return self
        gone = bisect.bisect_left(times, t - self.keep_seconds)
        ordered = list(self.ordered)
        for old in self.values[:gone]:
            at = bisect.bisect_left(ordered, old)
            if at < len(ordered) and ordered[at] == old:
                del ordered[at]
            else:  # a value that does not compare (NaN): sort what stays instead
                ordered = sorted(self.values[gone:])
                break
        bisect.insort(ordered, value)
        times, values = (*times[gone:], t), (*self.values[gone:], value)
        return TailBaseline(self.keep_seconds, self.min_span, self.every, self.quantile, times, values,
                            tuple(ordered), _quantile_of(times, ordered, self.min_span, self.quantile))

    def median(self) -> float | None:
        """The quantile of the values held (their median by default); None until they span `min_span`."""
        return self._median

    def __len__(self) -> int:
        return len(self.times)


def _quantile_of(times: tuple[float, ...], ordered: list[float], min_span: float, quantile: float) -> float | None:
    """The quantile of the sorted values: their median (as statistics.median gives it) for 0.5, else the
    lowest with at least that share at or under it; None until they span `min_span` seconds."""
    if not times or times[-1] - times[0] < min_span:
        return None
    n = len(ordered)
    if quantile == 0.5:
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return ordered[max(0, math.ceil(quantile * n) - 1)]
