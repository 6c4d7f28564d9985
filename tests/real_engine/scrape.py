"""Reading /metrics text and Prometheus answers in the real-engine tests.

Owns three small things the checks share: parsing an exposition with prometheus_client.parser into
(name, labels) -> value, a background poller that keeps timestamped copies of a /metrics page (to
see what the agent said *during* a run, not only at the end), and bucket arithmetic for "agrees
within the bucket resolution".
"""

from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from procs import http_text

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def select(samples: Samples, name: str, **labels: str) -> list[float]:
    """Values of every series called `name` whose labels include `labels`."""
    want = set(labels.items())
    return [v for (n, ls), v in samples.items() if n == name and want <= ls]


def one(samples: Samples, name: str, **labels: str) -> float:
    values = select(samples, name, **labels)
    assert len(values) == 1, f"expected one {name}{labels}, got {values}"
    return values[0]


LAST_SUCCESS = "rooflight_source_last_success_timestamp_seconds"


def sample_gap_near(pages: list[tuple[float, Samples]], last: Samples, window_s: float, **labels: str) -> float:
    """The longest wait between two of the agent's samples of one source (its last-success timestamps on the
    polled pages) within 2 s of where the window ending at its sample on `last` starts: a host stall there leaves
    the window's first sample later, its span shorter than the window."""
    end = one(last, LAST_SUCCESS, **labels)
    seen = {v for _, page in pages for v in select(page, LAST_SUCCESS, **labels)}
    times, start = sorted(seen | {end}), end - window_s
    return max((b - a for a, b in zip(times, times[1:]) if b >= start - 2.0 and a <= start + 2.0), default=0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(select(samples, name, **labels))


def buckets(samples: Samples, name: str) -> list[tuple[float, float]]:
    """(le, cumulative count) of one histogram, summed over series, sorted by le."""
    acc: dict[float, float] = {}
    for (n, ls), v in samples.items():
        if n == name + "_bucket":
            le = float(dict(ls)["le"])
            acc[le] = acc.get(le, 0.0) + v
    return sorted(acc.items())


def bucket_index(bounds: list[float], value: float) -> int:
    """Index of the bucket (le bounds, ascending) that holds value."""
    return bisect.bisect_left(bounds, value)


@dataclass
class Poller:
    """Fetch url every `interval` seconds in a thread; keeps (time.time(), text or None).

    The polls keep their own cadence (start to start): a slow answer delays the next poll, it does not add
    `interval` on top. On a loaded 2-core box an agent's page took up to 2.3 s and a 0.25 s wait up to
    1.8 s, so waiting `interval` after each answer made the page count a reading of the host's load."""

    url: str
    interval: float = 0.5
    enabled: bool = True
    pages: list[tuple[float, str | None]] = field(default_factory=list)
    failed: list[tuple[float, float, str]] = field(default_factory=list)  # (time.time() asked, seconds, why)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Poller":
        if not self.enabled:
            return self
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            asked, began = time.time(), time.monotonic()
            try:
                text: str | None = http_text(self.url, timeout=5.0)
            except OSError as e:
                text = None
                self.failed.append((asked, time.monotonic() - began, type(e).__name__))
            self.pages.append((time.time(), text))
            due = max(due + self.interval, time.monotonic())  # late: poll now, and keep the cadence from here
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stop(self) -> list[tuple[float, Samples]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.parsed()

    def parsed(self) -> list[tuple[float, Samples]]:
        return [(t, parse(text)) for t, text in list(self.pages) if text]

    def answered(self) -> list[float]:
        """When each page it got came back (time.time()); safe to call while it polls."""
        return [t for t, text in list(self.pages) if text]


def reference_quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """histogram_quantile as Prometheus 2.x interpolates it, over (le, cumulative count) pairs
    (sorted, +Inf last): linear within the bucket holding rank q*total, lower bound 0 for the
    first bucket, the last finite bound when the rank lands in +Inf."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(cumulative):
        if count >= rank:
            if le == float("inf"):
                return cumulative[i - 1][0] if i else None
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None


def bucket_delta(after: Samples, before: Samples, name: str) -> list[tuple[float, float]]:
    b = dict(buckets(before, name))
    return [(le, c - b.get(le, 0.0)) for le, c in buckets(after, name)]
