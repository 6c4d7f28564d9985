"""The worst gap between two tokens of one stream, as the client-side proxy saw it, by the time it ended.

The engine's ITL histogram tells the head-of-line detector which bucket its worst step fell in; with
vLLM's edges (0.025, 0.05, 0.075, ...) a 4 ms decode stretched to 60 ms reads as 2-3x, not 15x. When
`rooflight run --proxy-listen` relays the streams, every gap is known exactly: the proxy adds each one
here as its token arrives, and the engine's sampler asks for the worst stall since its previous sample.

A token is timed when the proxy's event loop reads it, so a loop that was busy elsewhere (a large body
parsed, a garbage collection, /metrics rendered) makes every stream's next gap longer by as much, and
the engine did not cause it. The proxy also records how late its own loop woke (`loop_lag`), and
`stall_between` takes the worst lag from the worst gap of the same span.

Per gap: a compare under a lock (a relay on a thread of the agent's process adds from that thread, the
sampler reads from the agent's loop), and a new slot every 1 / `slots_per_second` s; memory: one (slot,
worst) per slot that saw a value over `keep_seconds`. Under `rooflight run --proxy-listen` the relay runs in
a process of its own (agent/proxy/workers.py): its slots travel to the agent's copy (`slots_since`,
`merge`) every workers.GAPS_EVERY_SECONDS. No clock is read: callers pass times (the relay's and the
sampler's are the system's monotonic clock, one clock across the processes of a machine), so tests drive it
with a fake one.
"""

from __future__ import annotations

import math
import threading
from collections import deque


class SlotMaxima:
    """The largest value seen in each 1 / `slots_per_second` s slot, for `worst_between`."""

    __slots__ = ("slots_per_second", "keep_seconds", "_closed", "_open_index", "_open_until", "_open_worst", "_lock")

    def __init__(self, keep_seconds: float = 60.0, slots_per_second: int = 10) -> None:
        self.slots_per_second, self.keep_seconds = slots_per_second, keep_seconds
        self._lock = threading.Lock()  # one writer thread (the proxy's), one reader (the sampler's loop)
        self._closed: deque[tuple[int, float]] = deque()
        self._open_index: int | None = None
        self._open_until = float("-inf")
        self._open_worst = 0.0

    def add(self, t: float, value: float) -> None:
        """A value seen at `t` (for the proxy: a token arrived `value` seconds after its stream's previous one)."""
        with self._lock:
            if t >= self._open_until:
                self._open(t)
            if value > self._open_worst:
                self._open_worst = value

    def worst_between(self, start: float, end: float) -> float | None:
        """The largest value seen in [start, end], widened to whole slots; None when none was seen then."""
        first, last = self._slot(start), self._slot(end)
        worst: float | None = None
        with self._lock:
            if self._open_index is not None and first <= self._open_index <= last:
                worst = self._open_worst
            for index, value in reversed(self._closed):
                if index < first:
                    break
                if index <= last and (worst is None or value > worst):
                    worst = value
        return worst

    def slots_since(self, first: int) -> list[tuple[int, float]]:
        """(slot, worst) of every slot from `first` on, the open one last: what a relay in another process
        sends the agent's copy (`merge`). The open slot may grow: it is sent again with the next."""
        with self._lock:
            out = []
            for index, worst in reversed(self._closed):
                if index < first:
                    break
                out.append((index, worst))
            out.reverse()
            if self._open_index is not None and self._open_index >= first:
                out.append((self._open_index, self._open_worst))
        return out

    @property
    def open_slot(self) -> int | None:
        """The slot values are added to now (None before the first)."""
        return self._open_index

    def merge(self, slots: list[tuple[int, float]]) -> None:
        """Another process's (slot, worst) pairs (`slots_since`), oldest first: each slot keeps the larger of
        the two worsts, and slots older than `keep_seconds` before the newest are forgotten."""
        with self._lock:
            for index, worst in slots:
                if self._open_index is None or index > self._open_index:
                    if self._open_index is not None:
                        self._closed.append((self._open_index, self._open_worst))
                    self._open_index, self._open_worst = index, worst
                    self._open_until = (index + 1) / self.slots_per_second
                    oldest = index - math.ceil(self.keep_seconds * self.slots_per_second)
                    while self._closed and self._closed[0][0] < oldest:
                        self._closed.popleft()
                elif index == self._open_index:
                    self._open_worst = max(self._open_worst, worst)
                else:
                    self._merge_closed(index, worst)

    def _merge_closed(self, index: int, worst: float) -> None:
        closed = self._closed
        for at in range(len(closed) - 1, -1, -1):  # (the newest first: a late slot is a recent one)
            if closed[at][0] == index:
                closed[at] = (index, max(closed[at][1], worst))
                return
            if closed[at][0] < index:
                closed.insert(at + 1, (index, worst))
                return
        closed.appendleft((index, worst))

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


class ClientGaps(SlotMaxima):
    """Gaps between tokens as the proxy saw them (`add`), and how late its event loop woke (`loop_lag`)."""

    __slots__ = ("loop_lag",)

    def __init__(self, keep_seconds: float = 60.0, slots_per_second: int = 10) -> None:
        super().__init__(keep_seconds, slots_per_second)
        self.loop_lag = SlotMaxima(keep_seconds, slots_per_second)

    def stall_between(self, start: float, end: float) -> float | None:
        """The worst gap in [start, end] less the worst loop lag then: what the upstream took, at least.

        Conservative: a real stall that coincides with a busy loop reads shorter, never a busy loop as a
        stall. None when no token arrived in the span."""
        worst = self.worst_between(start, end)
        if worst is None:
            return None
        return max(0.0, worst - (self.loop_lag.worst_between(start, end) or 0.0))
