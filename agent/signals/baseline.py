"""The ITL tail's own recent median: what "inflated" is measured against.

A workload without chunked prefill always has a tail (every admitted prompt stretches one step), so p99
against p50 would flag steady traffic. Against the median of its own recent values, the p99 tail only
inflates when something new happens: one long prompt prefilled whole, say. One value per second is
kept; the median is given once the values span `min_span` seconds, so a cold start flags nothing.

A `quantile` other than the median gives the value that share of them stay at or under (the lowest
held value with at least that share at or below it: a bucket bound stays a bucket bound). The
head-of-line detector's largest step uses 0.6: where streams finish together, the seconds that
admitted a wave of prompts and those that did not are about even, and a median flips between them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class TailBaseline:
    def __init__(self, keep_seconds: float, min_span: float, every: float = 1.0, quantile: float = 0.5) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1) (got {quantile})")
        self.keep_seconds, self.min_span, self.every, self.quantile = keep_seconds, min_span, every, quantile
        self._values: deque[tuple[float, float]] = deque()
        self._median: float | None = None  # of the values held, kept until they change (once a second)
        self._median_known = False

    def add(self, t: float, value: float | None) -> None:
        if value is None:
            return
        if self._values and t - self._values[-1][0] < self.every:
            return
        self._values.append((t, value))
        while self._values and self._values[0][0] < t - self.keep_seconds:
            self._values.popleft()
        self._median_known = False

    def median(self) -> float | None:
        """Asked on every sample (ten a second at 10 Hz), while the values change once a second: a sort of
        up to `keep_seconds` values each time is kept for the next asks."""
        if not self._median_known:
            self._median, self._median_known = self._median_of_values(), True
        return self._median

    def _median_of_values(self) -> float | None:
        if not self._values or self._values[-1][0] - self._values[0][0] < self.min_span:
            return None
        if self.quantile == 0.5:
            return statistics.median(v for _, v in self._values)
        ordered = sorted(v for _, v in self._values)
        return ordered[max(0, math.ceil(self.quantile * len(ordered)) - 1)]

    def __len__(self) -> int:
        return len(self._values)
