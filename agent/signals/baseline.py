"""The ITL tail's own recent median: what "inflated" is measured against.

A workload without chunked prefill always has a tail (every admitted prompt stretches one step), so p99
against p50 would flag steady traffic. Against the median of its own recent values, the p99 tail only
inflates when something new happens: one long prompt prefilled whole, say. One value per second is
kept; the median is given once the values span `min_span` seconds, so a cold start flags nothing.
"""

from __future__ import annotations

import statistics
from collections import deque


class TailBaseline:
    def __init__(self, keep_seconds: float, min_span: float, every: float = 1.0) -> None:
        self.keep_seconds, self.min_span, self.every = keep_seconds, min_span, every
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
        return statistics.median(v for _, v in self._values)

    def __len__(self) -> int:
        return len(self._values)
