"""Windowed percentiles of per-request values: exact for one value per request, sketched for token gaps.

`ExactWindows` keeps every (time, value) of the longest window and sorts a window's values when a
snapshot asks (one value per request: tens of thousands over 5 minutes at most), interpolating between
the closest ranks as numpy's default `percentile` and the benchmark tools do.

Inter-token gaps come one per token, up to 10^5 a second, too many to keep for 5 minutes. `GapSketch`
counts them in logarithmic bins (DDSketch's mapping) with a relative error of at most `alpha` (0.5% by
default), per 1 s slot, and keeps a running total per window; a percentile is the representative of the
bin that holds the rank. Adding a gap costs one log and a few dict increments; memory is bounded by the
bins in use (about 2,000 between 10 us and 100 s), not by the traffic.

Both are driven by the caller's clock (no sleeps, no wall time), so tests move a fake clock.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Iterable, Mapping

MAX_VALUES = 500_000  # per ExactWindows: beyond this the oldest values are dropped (memory bound)
ZERO_BELOW = 1e-6  # gaps below 1 us count as 0 (tokens delivered in one read)


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) of sorted values, linear between the closest ranks; None if empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class ExactWindows:
    """Every value of the longest window, with its time; percentiles per window on demand."""

    def __init__(self, windows: Mapping[str, float], max_values: int = MAX_VALUES) -> None:
        self.windows = dict(windows)
        self.retention = max(self.windows.values(), default=0.0)
        self.max_values = max_values
        self._times: list[float] = []
        self._values: list[float] = []
        self._start = 0  # entries before this index have expired (compacted in batches)

    def __len__(self) -> int:
        return len(self._times) - self._start

    def add(self, t: float, value: float) -> None:
        if self._times and t < self._times[-1]:
            t = self._times[-1]  # keep the list sorted by time even if callers race by a tick
        self._times.append(t)
        self._values.append(value)
        if len(self) > self.max_values:
            self._start += len(self) - self.max_values
        self._compact()

    def expire(self, now: float) -> None:
        self._start = max(self._start, bisect.bisect_left(self._times, now - self.retention, self._start))
        self._compact()

    def window_values(self, now: float, seconds: float) -> list[float]:
        i = max(self._start, bisect.bisect_left(self._times, now - seconds, self._start))
        return self._values[i:]

    def percentiles(self, now: float, qs: Iterable[float]) -> dict[str, dict[float, float]]:
        """{window: {q: value}} for every window that holds a value."""
        self.expire(now)
        out: dict[str, dict[float, float]] = {}
        for name, seconds in self.windows.items():
            values = sorted(self.window_values(now, seconds))
            if values:
                out[name] = {q: percentile(values, q) for q in qs}  # type: ignore[misc]
        return out

    def _compact(self) -> None:
        if self._start > 4096 and self._start * 2 > len(self._times):
            del self._times[: self._start]
            del self._values[: self._start]
            self._start = 0


class _Window:
    __slots__ = ("seconds", "counts", "zeros", "n", "slots")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.counts: dict[int, int] = {}
        self.zeros = 0
        self.n = 0
        self.slots: deque[tuple[int, dict[int, int], list[int]]] = deque()


class GapSketch:
    """Log-binned counts of gaps per 1 s slot, summed per window as slots come and go."""

    def __init__(self, windows: Mapping[str, float], alpha: float = 0.005, slot: float = 1.0) -> None:
        self.alpha = alpha
        self.gamma = (1 + alpha) / (1 - alpha)
        self._inv_log_gamma = 1.0 / math.log(self.gamma)
        self.slot = slot
        self._windows = {name: _Window(seconds) for name, seconds in windows.items()}
        self._slot_index: int | None = None
        self._slot_counts: dict[int, int] = {}
        self._slot_zeros = [0]

    def index(self, value: float) -> int:
        return math.ceil(math.log(value) * self._inv_log_gamma)

    def value_of(self, index: int) -> float:
        """The bin's representative: within alpha of every value the bin holds."""
        return 2 * self.gamma ** index / (self.gamma + 1)

    def add_many(self, t: float, gaps: Iterable[float]) -> None:
        """A request's gaps, binned once, then added bin by bin to the slot and to every window (a stream's
        gaps fall in a few dozen bins: a dict update per gap and window cost 3x the binning)."""
        self._roll(t)
        log, inv, ceil = math.log, self._inv_log_gamma, math.ceil
        binned: dict[int, int] = {}
        zeros = 0
        for gap in gaps:
            if gap < ZERO_BELOW:
                zeros += 1
            else:
                i = ceil(log(gap) * inv)
                binned[i] = binned.get(i, 0) + 1
        n = zeros + sum(binned.values())
        self._slot_zeros[0] += zeros
        for counts in (self._slot_counts, *(w.counts for w in self._windows.values())):
            for i, c in binned.items():
                counts[i] = counts.get(i, 0) + c
        for w in self._windows.values():
            w.zeros += zeros
            w.n += n

    def expire(self, now: float) -> None:
        self._roll(now)
        for w in self._windows.values():
            while w.slots and (w.slots[0][0] + 1) * self.slot <= now - w.seconds:
                _, counts, zeros = w.slots.popleft()
                for i, c in counts.items():
                    left = w.counts[i] - c
                    if left:
                        w.counts[i] = left
                    else:
                        del w.counts[i]
                    w.n -= c
                w.zeros -= zeros[0]
                w.n -= zeros[0]

    def percentiles(self, now: float, qs: Iterable[float]) -> dict[str, dict[float, float]]:
        """{window: {q: value}} for every window that holds a gap; nearest rank, within alpha."""
        self.expire(now)
        qs = tuple(qs)
        out: dict[str, dict[float, float]] = {}
        for name, w in self._windows.items():
            if w.n <= 0:
                continue
            ordered = sorted(w.counts.items())
            out[name] = {q: self._rank_value(w, ordered, q) for q in qs}
        return out

    def _rank_value(self, w: _Window, ordered: list[tuple[int, int]], q: float) -> float:
        rank = max(1, math.ceil(q / 100.0 * w.n))
        if rank <= w.zeros:
            return 0.0
        seen = w.zeros
        for i, c in ordered:
            seen += c
            if seen >= rank:
                return self.value_of(i)
        return self.value_of(ordered[-1][0])

    def _roll(self, t: float) -> None:
        index = int(t // self.slot)
        if self._slot_index is not None and index <= self._slot_index:
            return
        self._slot_index = index
        self._slot_counts = {}
        self._slot_zeros = [0]
        for w in self._windows.values():
            w.slots.append((index, self._slot_counts, self._slot_zeros))
