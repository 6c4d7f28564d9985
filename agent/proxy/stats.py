"""Finished requests in, an immutable `ClientSnapshot` out: all the proxy's arithmetic, none of its I/O.

`ClientStats.observe` takes one `RequestRecord` (called once per request, after the response ended);
`snapshot(now)` expires the windows and freezes counters, histograms, windowed percentiles and goodput
into tuples that the Collector only formats. Nothing here reads a clock: callers pass times, so tests
drive it with a fake one.

Bounded memory: one value per request for the exact windows (capped), log bins for gaps, and per-tenant
series for at most 2 x N + 2 tenant labels (the least recently seen unnamed ones are dropped first).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.quantiles import ExactWindows, GapSketch
from rooflight.agent.proxy.slo import SLO, judged, meets
from rooflight.agent.proxy.sse import MAX_USAGE_TOKENS
from rooflight.agent.proxy.tenants import NONE, OTHER, TenantTop
from rooflight.agent.proxy.tracker import RequestRecord

Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StatsConfig:
    target: str  # the upstream's host:port, the `target` label (as the engine side names it)
    buckets: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: dict(c.DEFAULT_BUCKETS))
    windows: Mapping[str, float] = field(default_factory=lambda: {"10s": 10.0, "1m": 60.0, "5m": 300.0})
    percentiles: tuple[str, ...] = ("50", "90", "99")
    slos: tuple[SLO, ...] = ()
    tenant_top: int = 10


def histogram_edges(config_buckets: Mapping[str, tuple[float, ...]], slos: tuple[SLO, ...]) -> dict[str, tuple[float, ...]]:
    """Each histogram's edges plus every SLO target of its metric, so a burn-rate rule can use them exactly."""
    out = {}
    for key in c.HISTOGRAMS:
        edges = set(config_buckets.get(key, c.DEFAULT_BUCKETS[key]))
        edges.update(t for slo in slos for k, t in slo.targets if k == key)
        out[key] = tuple(sorted(edges))
    return out


class _Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        """observe() for each value, in order (the same sum to the last bit), without a call per value."""
        counts, bounds, where, total = self.counts, self.bounds, bisect.bisect_left, self.sum
        for value in values:
            counts[where(bounds, value)] += 1
            total += value
        self.sum = total

    def cumulative(self) -> tuple[int, ...]:
        out, total = [], 0
        for n in self.counts:
            total += n
            out.append(total)
        return tuple(out)


@dataclass(frozen=True, slots=True)
class HistogramValue:
    name: str
    labels: Labels
    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]  # one per bound, then +Inf (= the count)
    sum: float


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    """What the Collector renders: (name, labels, value) triples and histograms, frozen."""

    created: float
    counters: tuple[tuple[str, Labels, float], ...] = ()
    gauges: tuple[tuple[str, Labels, float], ...] = ()
    histograms: tuple[HistogramValue, ...] = ()


EMPTY = ClientSnapshot(created=0.0)


def _bounded(r: RequestRecord) -> RequestRecord:
    """`r` without a token count past MAX_USAGE_TOKENS (agent/proxy/sse.py reads none; a record from a worker
    process is checked again here, where the sums are kept): an integer past a float's range made the
    request's TPOT raise, and every snapshot after it."""
    prompt, output = r.prompt_tokens, r.output_tokens
    prompt_ok = prompt is None or 0 <= prompt <= MAX_USAGE_TOKENS
    output_ok = output is None or 0 <= output <= MAX_USAGE_TOKENS
    if prompt_ok and output_ok:
        return r
    return replace(r, prompt_tokens=prompt if prompt_ok else None, output_tokens=output if output_ok else None,
                   counted_by=r.counted_by if output_ok else None)


class ClientStats:
    """Accumulates finished requests. Owned by one event loop: no locks, no awaits."""

    def __init__(self, config: StatsConfig, started: float) -> None:
        self.config = config
        self.started = started
        self.in_flight = 0
        self._edges = histogram_edges(config.buckets, config.slos)
        self._qs = tuple(float(p) for p in config.percentiles)
        self._requests: Counter[Labels] = Counter()
        self._prompt: Counter[Labels] = Counter()
        self._output: Counter[Labels] = Counter()
        self._slo_judged: Counter[Labels] = Counter()
        self._slo_good: Counter[Labels] = Counter()
        self._upstream_errors: Counter[str] = Counter()
        self.accounting_errors = 0
        self.over_budget = 0  # answers relayed unaccounted: the accounting's memory budget was spent
        self.refused: Counter[str] = Counter()  # connections refused on the proxy's port, by reason
        self.bad_requests: Counter[str] = Counter()  # requests answered 400, by reason
        self.request_log_lost: int | None = None  # --request-log's lines lost; None without one
        self.worker_restarts: int | None = None  # --workers N: workers replaced; None with one process
        self._histograms: dict[tuple[str, str], _Histogram] = {}
        self._exact = {key: ExactWindows(config.windows) for key in ("ttft", "tpot", "e2e")}
        self._gaps = GapSketch(config.windows)
        self._judged_times: list[float] = []  # judged requests, by finish time
        self._judged_good: list[int] = []  # bit i set: met SLO i
        self._tenants = TenantTop(config.tenant_top)
        self._tenant_seen: dict[str, int] = {}
        self._seq = 0

    def accounting_error(self) -> None:
        self.accounting_errors += 1

    def observe(self, r: RequestRecord) -> None:
        """Count one finished request (its end time is its place in the windows)."""
        r = _bounded(r)
        tenant = self._tenants.label(r.tenant)
        self._seq += 1
        self._tenant_seen[tenant] = self._seq
        status = "none" if r.status is None else str(r.status)
        self._requests[(r.route, "true" if r.stream else "false", status, r.finish_reason, tenant)] += 1
        if r.upstream_error:
            self._upstream_errors[r.upstream_error] += 1
        if not r.inference:
            return
        if r.prompt_tokens is not None:
            self._prompt[(tenant, "usage")] += r.prompt_tokens
        if r.output_tokens is not None and r.counted_by is not None:
            self._output[(tenant, r.counted_by)] += r.output_tokens
        self._timings(r)
        self._goodput(r, tenant)

    def _timings(self, r: RequestRecord) -> None:
        if r.ttft is not None:
            self._hist("ttft", r.route).observe(r.ttft)
            self._exact["ttft"].add(r.end, r.ttft)
        if len(r.itl):
            self._hist("itl", r.route).observe_many(r.itl)
            self._gaps.add_many(r.end, r.itl)
        if not r.ok:
            return
        tpot = r.tpot
        if tpot is not None and r.stream:
            self._hist("tpot", r.route).observe(tpot)
            self._exact["tpot"].add(r.end, tpot)
        self._hist("e2e", r.route).observe(r.e2e)
        self._exact["e2e"].add(r.end, r.e2e)

    def _goodput(self, r: RequestRecord, tenant: str) -> None:
        if not self.config.slos or not judged(r):
            return
        bits = 0
        for i, slo in enumerate(self.config.slos):
            self._slo_judged[(slo.name, tenant)] += 1
            if meets(slo, r):
                self._slo_good[(slo.name, tenant)] += 1
                bits |= 1 << i
        t = max(r.end, self._judged_times[-1]) if self._judged_times else r.end
        self._judged_times.append(t)
        self._judged_good.append(bits)

    def _hist(self, key: str, route: str) -> _Histogram:
        h = self._histograms.get((key, route))
        if h is None:
            h = self._histograms[(key, route)] = _Histogram(self._edges[key])
        return h

    def snapshot(self, now: float) -> ClientSnapshot:
        """Expire the windows and freeze everything; the tenant ranking is refreshed here too."""
        self._tenants.refresh()
        self._bound_tenants()
        target = self.config.target
        counters: list[tuple[str, Labels, float]] = []
        counters += self._frozen(c.REQUESTS, self._requests)
        counters += self._frozen(c.PROMPT_TOKENS, self._prompt)
        counters += self._frozen(c.OUTPUT_TOKENS, self._output)
        for slo in self.config.slos:
            for (name, tenant), v in sorted(self._slo_judged.items()):
                if name == slo.name:
                    counters.append((c.SLO_REQUESTS, (target, name, tenant), float(v)))
                    counters.append((c.SLO_GOOD, (target, name, tenant), float(self._slo_good.get((name, tenant), 0))))
        counters += self._frozen(c.UPSTREAM_ERRORS, self._upstream_errors)
        counters.append((c.ACCOUNTING_ERRORS, (target,), float(self.accounting_errors)))
        counters.append((c.OVER_BUDGET, (target,), float(self.over_budget)))
        counters += self._frozen(c.REFUSED, self.refused)
        counters += self._frozen(c.BAD_REQUESTS, self.bad_requests)
        if self.request_log_lost is not None:
            counters.append((c.REQUEST_LOG_LOST, (target,), float(self.request_log_lost)))
        if self.worker_restarts is not None:
            counters.append((c.WORKER_RESTARTS, (target,), float(self.worker_restarts)))
        gauges: list[tuple[str, Labels, float]] = [(c.IN_FLIGHT, (target,), float(self.in_flight))]
        gauges += self._percentile_gauges(now)
        gauges += self._goodput_gauges(now)
        for slo in self.config.slos:
            gauges += [(c.SLO_TARGET, (target, slo.name, key), value) for key, value in slo.targets]
        histograms = tuple(
            HistogramValue(c.HISTOGRAMS[key], (target, route), h.bounds, h.cumulative(), h.sum)
            for (key, route), h in sorted(self._histograms.items())
        )
        return ClientSnapshot(now, tuple(counters), tuple(gauges), histograms)

    def _frozen(self, name: str, counter: "Counter[Labels] | Counter[str]") -> list[tuple[str, Labels, float]]:
        """`counter`'s series as floats, by label values. One whose total no float holds is left out for good
        and counted as an accounting error, so a snapshot never fails whole for one value (a sum of the
        upstream's numbers is bounded where they are read, and again in observe: this is the last guard)."""
        target, out, lost = self.config.target, [], []
        for key, v in sorted(counter.items()):
            try:
                out.append((name, (target, *key) if isinstance(key, tuple) else (target, key), float(v)))
            except OverflowError:
                lost.append(key)
        for key in lost:
            del counter[key]  # type: ignore[arg-type]
            self.accounting_errors += 1
        return out

    def _percentile_gauges(self, now: float) -> list[tuple[str, Labels, float]]:
        target, out = self.config.target, []
        names = {"ttft": c.TTFT, "tpot": c.TPOT, "e2e": c.E2E}
        sources = [(names[k], w.percentiles(now, self._qs)) for k, w in self._exact.items()]
        sources.append((c.ITL, self._gaps.percentiles(now, self._qs)))
        for name, by_window in sources:
            for window in self.config.windows:
                values = by_window.get(window)
                if values is None:
                    continue
                for label, q in zip(self.config.percentiles, self._qs):
                    out.append((name, (target, window, label), values[q]))
        return out

    def _goodput_gauges(self, now: float) -> list[tuple[str, Labels, float]]:
        if not self.config.slos:
            return []
        self._expire_judged(now)
        target, out = self.config.target, []
        for window, seconds in self.config.windows.items():
            i = bisect.bisect_left(self._judged_times, now - seconds)
            bits = self._judged_good[i:]
            span = min(seconds, now - self.started)
            for s, slo in enumerate(self.config.slos):
                good = sum(1 for b in bits if b >> s & 1)
                if bits:
                    out.append((c.GOODPUT_RATIO, (target, slo.name, window), good / len(bits)))
                if span > 0:
                    out.append((c.GOODPUT_RATE, (target, slo.name, window), good / span))
        return out

    def _expire_judged(self, now: float) -> None:
        longest = max(self.config.windows.values(), default=0.0)
        cut = bisect.bisect_left(self._judged_times, now - longest)
        if cut:
            del self._judged_times[:cut]
            del self._judged_good[:cut]

    def _bound_tenants(self) -> None:
        cap = 2 * self.config.tenant_top + 2
        if len(self._tenant_seen) <= cap:
            return
        keep = set(self._tenants.refresh()) | {OTHER, NONE}
        stale = sorted((seq, t) for t, seq in self._tenant_seen.items() if t not in keep)
        for _, tenant in stale[: len(self._tenant_seen) - cap]:
            del self._tenant_seen[tenant]
            for counter, pos in ((self._requests, 4), (self._prompt, 0), (self._output, 0)):
                for key in [k for k in counter if k[pos] == tenant]:
                    del counter[key]
            for counter in (self._slo_judged, self._slo_good):
                for key in [k for k in counter if k[1] == tenant]:
                    del counter[key]
