"""The status page's sparklines: a few numbers of each series at its engine samples, kept by the agent for the
last five minutes, so that a page opened now draws the minutes before it was opened.

The agent records a target's series once per engine sample (Agent.publish, for the loops that just stepped).
A ring keeps every sample until it is full, then every other one (twice as far apart), and drops what is older
than HISTORY_SECONDS: at any interval and any number of series it spans up to five minutes in its share of
HISTORY_TOTAL_POINTS (one series 300 points, 128 series 32 each). The numbers are the snapshot's own (its
shortest window): nothing is computed again. Recorded on the
event loop, read by the status thread: one lock, held for an append or a copy.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Deque

from rooflight.agent.metrics.snapshot import SeriesView, TargetView

HISTORY_SECONDS = 300.0  # the span every ring keeps ...
HISTORY_POINTS = 300  # ... in at most this many points a series ...
HISTORY_TOTAL_POINTS = 4096  # ... and this many all series together (the status answer's size bound)
MIN_POINTS = 8  # a sparkline's fewest points, however many series share the budget
HISTORY_FIELDS = ("mbu", "mfu_prefill", "mfu_decode", "tokens_prefill", "tokens_decode", "ttft_p99", "itl_p99",
                  "kv_usage", "running", "waiting", "preemptions_per_second")

SeriesKey = tuple[str, str, str]  # target, model, rank
Point = tuple[float, tuple[float | None, ...]]


def _num(value: float | None) -> float | None:
    """A number JSON can carry and /metrics would show: finite and not negative, else None."""
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else None


def history_values(view: SeriesView) -> tuple[float | None, ...]:
    """One sparkline sample of a series, in HISTORY_FIELDS order, from its shortest window."""
    w = view.windows[0] if view.windows else None
    s = view.series
    return (
        _num(w.mbu) if w else None,
        _num(w.mfu.get("prefill")) if w else None,
        _num(w.mfu.get("decode")) if w else None,
        _num(w.tokens_per_second.get("prefill")) if w else None,
        _num(w.tokens_per_second.get("decode")) if w else None,
        _num(w.ttft.get("99")) if w else None,
        _num(w.itl.get("99")) if w else None,
        _num(s.kv_usage_ratio),
        _num(s.running),
        _num(s.waiting),
        _num(w.preemptions_per_second) if w else None,
    )


class _Ring:
    """One series' points, at least `gap` seconds apart but for the newest sample, which is always the last."""

    __slots__ = ("points", "gap")

    def __init__(self) -> None:
        self.points: Deque[Point] = deque()
        self.gap = 0.0

    def add(self, t: float, values: tuple[float | None, ...], size: int, seconds: float) -> None:
        points = self.points
        if points and t <= points[-1][0]:
            return  # this sample is in already
        if len(points) >= 2 and t - points[-2][0] < self.gap * 0.9:  # a little under: a late sample still lands
            points[-1] = (t, values)  # the newest sample always shows: it takes the place of the one before
            return
        while points and t - points[0][0] > seconds:
            points.popleft()
        points.append((t, values))
        while len(points) > size:  # full before it spans `seconds`: every other point, twice as far apart
            kept = list(points)[::-1][::2][::-1]
            self.points = points = deque(kept)
            self.gap = (kept[-1][0] - kept[0][0]) / max(1, len(kept) - 1)


class Sparklines:
    """Each series' sparkline ring: at most `points` (all series together `total`), within the last `seconds`.

    A ring keeps every sample until it is full, then every other one, and so on: a page opened a minute after
    the agent started draws that minute sample by sample, one opened later the last five minutes."""

    def __init__(self, points: int = HISTORY_POINTS, total: int | None = None,
                 seconds: float = HISTORY_SECONDS) -> None:
        self.points, self.total, self.seconds = points, total or HISTORY_TOTAL_POINTS, seconds
        self._rings: dict[SeriesKey, _Ring] = {}
        self._lock = threading.Lock()

    def record(self, target: TargetView, t: float | None, series_count: int) -> None:
        """Add `target`'s series at engine time `t` (a new sample's; None: not sampled yet); `series_count`:
        every target's series together, which share the points. A series that left the target goes."""
        size = min(self.points, max(MIN_POINTS, self.total // max(1, series_count)))
        keys = set()
        with self._lock:
            for view in target.series:
                key = (target.name, view.series.model, view.series.rank)
                keys.add(key)
                ring = self._rings.setdefault(key, _Ring())
                if t is not None:
                    ring.add(t, history_values(view), size, self.seconds)
            for key in [k for k in self._rings if k[0] == target.name and k not in keys]:
                del self._rings[key]

    def series(self, key: SeriesKey) -> dict[str, list[float | None]]:
        """The ring as columns: "t" and one list per HISTORY_FIELDS name."""
        with self._lock:
            ring = self._rings.get(key)
            points = list(ring.points) if ring is not None else []
        out: dict[str, list[float | None]] = {"t": [t for t, _ in points]}
        for i, name in enumerate(HISTORY_FIELDS):
            out[name] = [values[i] for _, values in points]
        return out
