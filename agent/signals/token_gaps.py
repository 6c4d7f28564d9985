"""The worst gap between two tokens of one stream, as the client-side proxy saw it, by the time it ended.

The engine's ITL histogram tells the head-of-line detector which bucket its worst step fell in; with
vLLM's edges (0.025, 0.05, 0.075, ...) a 4 ms decode stretched to 60 ms reads as 2-3x, not 15x. When
`rooflight run --proxy-listen` relays the streams, every gap is known exactly: the proxy adds each one
here as its token arrives, and the engine's sampler asks for the worst gap since its previous sample.

Per gap: a compare, and a new slot every 1 / `slots_per_second` s; memory: one (slot, worst) per slot that saw a
gap over `keep_seconds`. No clock is read: callers pass times (the proxy's and the sampler's clocks are
the same monotonic clock in one process), so tests drive it with a fake one.
"""

from __future__ import annotations

import math
from collections import deque


class ClientGaps:
    """Per-slot maxima of client-seen inter-token gaps, for `worst_between`."""

    __slots__ = ("slots_per_second", "keep_seconds", "_closed", "_open_index", "_open_until", "_open_worst")

    def __init__(self, keep_seconds: float = 60.0, slots_per_second: int = 10) -> None:
        self.slots_per_second, self.keep_seconds = slots_per_second, keep_seconds
        self._closed: deque[tuple[int, float]] = deque()
        self._open_index: int | None = None
        self._open_until = float("-inf")
        self._open_worst = 0.0

    def add(self, t: float, gap: float) -> None:
        """A token arrived at `t`, `gap` seconds after the previous token of its stream."""
        if t >= self._open_until:
            self._open(t)
        if gap > self._open_worst:
            self._open_worst = gap

    def worst_between(self, start: float, end: float) -> float | None:
        """The worst gap that ended in [start, end], widened to whole slots; None when no token arrived then."""
        first, last = self._slot(start), self._slot(end)
        worst: float | None = None
        if self._open_index is not None and first <= self._open_index <= last:
            worst = self._open_worst
        for index, value in reversed(self._closed):
            if index < first:
                break
            if index <= last and (worst is None or value > worst):
                worst = value
        return worst

    def _open(self, t: float) -> None:
        if self._open_index is not None:
            self._closed.append((self._open_index, self._open_worst))
        self._open_index = self._slot(t)
        self._open_until = (self._open_index + 1) / self.slots_per_second
        self._open_worst = 0.0
        oldest = self._slot(t - self.keep_seconds)
        while self._closed and self._closed[0][0] < oldest:
            self._closed.popleft()

    def _slot(self, t: float) -> int:
        # t x an integer rate, not t // 0.1: 101.5 // 0.1 is 1014.0 in binary floating point.
        return math.floor(t * self.slots_per_second)
