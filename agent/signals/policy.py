"""Detector policy: what the detectors judge against, how long a verdict holds, and how often the longer
windows are derived again. Pure: each function takes a series' DetectorState and gives the next one; the
sampling loop keeps one per (model, rank) and passes it to signals/series.py's derive step once a sample.

- The ITL tail's baselines (docs/physics.md, section Head-of-line blocking): the worst ITL since the
  previous sample against its own recent median, one baseline per source (the engine's histogram, the
  proxy's exact gaps), and the largest recent step against the usual largest step.
- The head-of-line hold: the flag stays up DetectorThresholds.hol_hold_seconds after the last stall, so a
  15-30 s Prometheus scrape sees a stall that lasted one step.
- The rising edges: which verdicts turned on since the series' previous verdicts (the loop leaves the NVTX
  mark each detector declares, for Nsight Systems).
- The windows' cadence (docs/metrics.md, Conventions): each derived again once it is a sixtieth of its length
  old.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals import derive
from rooflight.agent.signals.baseline import TailBaseline
from rooflight.agent.signals.detectors import ITL_FROM_ENGINE, ITL_FROM_PROXY, Verdicts, detectors
from rooflight.agent.signals.headroom import SignalSettings, WindowSignals
from rooflight.agent.signals.windows import Point, SeriesHistory, histogram_delta, increase, worst_bound

# Each window is derived again once it is WINDOW_STALE_SHARE of its length old (docs/metrics.md, Conventions):
# a 1m window every second, a 5m one every 5 s, a 10s one every other sample at 10 Hz and on every sample at
# 1 Hz. In that time its start and end move by under 2% of it, so deriving it on every sample would cost ten
# times the work at 10 Hz, and five times a 5m window's at 1 Hz, for no information. What the detectors judge
# of the latest sample itself (the worst ITL, the largest step, the gauges, a stall) is read on every sample.
WINDOW_STALE_SHARE = 1 / 60

# The usual largest step: the value 80% of the recent prefill seconds' largest steps stay at or under
# (signals/baseline.py says why not their median; docs/physics.md, section Head-of-line blocking): a
# step that a fifth of them reach is usual, one four times that is not.
STEP_BASELINE_QUANTILE = 0.8
# How far back a step far larger than usual is looked for, against the stall since the previous sample.
STEP_LOOKBACK_SECONDS = 2.0
STEP_SIZES = "steps"  # the source named by the largest step's ItlTail
# The worst ITL is looked for over this many sampling intervals back (one sample, with room for jitter).
ITL_SPAN_INTERVALS = 1.5


class KeptWindows(NamedTuple):
    """The windows of one series as last derived, each when it was, and what from."""

    at: tuple[float, ...]  # monotonic: when each window was last derived, in DeriveSettings.windows' order
    constants: TargetConstants
    kv_capacity_tokens: float | None
    # Each as last derived and checked against the GPUs' physics (signals/bounds.py); None: the history did not
    # cover it.
    derived: tuple[derive.WindowValues | None, ...]


class KeptSignals(NamedTuple):
    """The windows' capacity signals as last computed, each with the window it came from."""

    windows: tuple[derive.WindowValues, ...]
    batch_max: float | None
    settings: SignalSettings
    signals: tuple[WindowSignals, ...]


class GaugeExtremes(NamedTuple):
    """The points of the highest KV occupancy and the shortest queue from `first` to `last`, as last read."""

    first: float  # monotonic: the start of the span read
    last: Point  # the newest point read
    peak: Point | None  # None: no point of the span had the gauge
    low: Point | None


class DetectorState(NamedTuple):
    """What one series carries from one sample to the next; the initial one is DetectorState(). A
    NamedTuple rather than a frozen dataclass: it is replaced a few times per series and sample, and
    _replace costs a fraction of dataclasses.replace."""

    itl_engine: TailBaseline | None = None  # the worst ITL's recent values, from the engine's histogram
    itl_proxy: TailBaseline | None = None  # ... from the proxy's gaps between tokens
    step_sizes: TailBaseline | None = None  # the largest step of the seconds that ran a prefill
    last_stall: float | None = None  # monotonic time head-of-line was last judged on
    raised: Verdicts | None = None  # the verdicts last judged (rising edges)
    windows: KeptWindows | None = None  # the windows as last derived (their cadence)
    signals: KeptSignals | None = None  # their signals, kept while they stand
    work: derive.WorkTotals | None = None  # the work counters' totals (derive.accumulate_work)
    extremes: GaugeExtremes | None = None  # the shortest window's KV peak and queue floor (kv_peak_and_queue_floor)


class ItlTail(NamedTuple):
    """The worst ITL since the previous sample, its recent median, and which source measured both; and
    the largest step of the last STEP_LOOKBACK_SECONDS with the usual largest step (None where the engine
    does not tell its steps' sizes)."""

    worst: float | None
    baseline: float | None
    source: str
    largest_step: float | None = None
    largest_step_baseline: float | None = None


@dataclass(frozen=True, slots=True)
class TailSpan:
    """How long a tail baseline keeps its values, and how long they must span before it judges."""

    keep_seconds: float
    min_span: float

    def new(self, quantile: float = 0.5) -> TailBaseline:
        return TailBaseline(keep_seconds=self.keep_seconds, min_span=self.min_span, quantile=quantile)


def tail_span(windows_seconds: tuple[float, ...]) -> TailSpan:
    """Values kept over the longest window; judged once they span three of the shortest."""
    return TailSpan(keep_seconds=max(windows_seconds), min_span=3 * min(windows_seconds))


def _against_baseline(tail: TailBaseline, now: float, worst: float | None, source: str) -> tuple[ItlTail, TailBaseline]:
    """The worst against the baseline of the recent past (before it joins), and the baseline it joined."""
    return ItlTail(worst, tail.median(), source), tail.add(now, worst)


def itl_tail(state: DetectorState, history: SeriesHistory | None, interval: float, span: TailSpan, now: float,
             proxy_worst: float | None = None, proxy_judges: bool = False) -> tuple[ItlTail, DetectorState]:
    """The worst ITL since the previous sample, the median of that worst over the recent past, and
    their source: the proxy's exact gaps (`proxy_worst`, the worst of ITL_SPAN_INTERVALS intervals) where
    it relays this target's streams and saw some, else the engine's histogram (docs/physics.md, section
    Head-of-line blocking).

    At the agent's resolution (1 s) one stalled step is a visible share of the tokens, where in a
    10 s or 1 m window its few observations vanish below p99. The proxy cannot tell which model or
    rank a stream ran on, so it judges only a target with one series (`proxy_judges`). With either
    source, the largest recent step against the usual largest one (where the engine tells its steps'
    sizes) says whether a step far larger than usual, a long prompt run whole, came with the stall.
    """
    if history is None:
        return ItlTail(None, None, ITL_FROM_ENGINE), state
    since = ITL_SPAN_INTERVALS * interval
    recent = _back_to(history, since)  # since the previous sample, however late this one came
    delta = histogram_delta(*recent, derive.ITL) if recent else None
    largest, steps = _largest_step(state.step_sizes or span.new(STEP_BASELINE_QUANTILE), recent,
                                   _back_to(history, max(since, STEP_LOOKBACK_SECONDS)), now)
    engine, itl_engine = _against_baseline(state.itl_engine or span.new(), now,
                                           worst_bound(delta) if delta else None, ITL_FROM_ENGINE)
    state = state._replace(step_sizes=steps, itl_engine=itl_engine)
    tail = engine
    if proxy_judges:
        proxy, itl_proxy = _against_baseline(state.itl_proxy or span.new(), now, proxy_worst, ITL_FROM_PROXY)
        state = state._replace(itl_proxy=itl_proxy)
        if proxy.worst is not None and proxy.baseline:  # 0: the streams arrive in bursts, no gaps to judge
            tail = proxy
    return tail._replace(largest_step=largest.worst, largest_step_baseline=largest.baseline), state


def _back_to(history: SeriesHistory, seconds: float) -> tuple[Point, Point] | None:
    """The points of the last `seconds`, at least the last interval. SeriesHistory.window wants its points
    to span half the window; at 1 Hz a 2 s look back finds one interval, and sampling jitter makes it
    0.999 s one time in five: the step of a stall went unseen in that sample."""
    return history.window(seconds, reach=None) or history.last_interval()


def _largest_step(tail: TailBaseline, span: tuple[Point, Point] | None, lookback: tuple[Point, Point] | None,
                  now: float) -> tuple[ItlTail, TailBaseline]:
    """The largest step over the last STEP_LOOKBACK_SECONDS (tokens, its bucket's bound) and the usual
    largest step of the seconds that ran a prefill (STEP_BASELINE_QUANTILE of them; docs/physics.md,
    section Head-of-line blocking). A second of decode steps alone joins no baseline: against it, any
    admitted prompt would look large. The step is looked for further back than the stall: the
    proxy times a gap when its token arrives, the engine's counters show the step when a scrape
    reads them, and on a busy host the two can fall a sample apart."""
    steps = histogram_delta(*span, derive.STEP_TOKENS) if span else None
    prefilled = increase(*span, derive.PROMPT) if span else None
    joins = worst_bound(steps) if steps and (prefilled is None or prefilled > 0) else None
    recent = histogram_delta(*lookback, derive.STEP_TOKENS) if lookback else None
    baseline = tail.median()  # before this value joins: the baseline is the recent past
    return ItlTail(worst_bound(recent) if recent else None, baseline, STEP_SIZES), tail.add(now, joins)


def hold_head_of_line(state: DetectorState, verdicts: Verdicts | None, now: float,
                      hold_seconds: float) -> tuple[Verdicts | None, DetectorState]:
    """Head-of-line kept up `hold_seconds` after the last stall (a stall lasts one step; a scrape comes
    every 15-30 s)."""
    if verdicts is not None and verdicts.head_of_line:
        state = state._replace(last_stall=now)
    last = state.last_stall
    if verdicts is None or last is None or now - last > hold_seconds:
        return verdicts, state
    return verdicts.replace(head_of_line=True), state


def rising_edges(state: DetectorState, verdicts: Verdicts | None) -> tuple[tuple[str, ...], DetectorState]:
    """The NVTX marks (each detector declares its own, or none) of the verdicts that turned on since the
    series' previous verdicts, so an Nsight Systems capture lines the detector up with the kernels (no
    verdicts: nothing, and the previous ones kept)."""
    if verdicts is None:
        return (), state
    before = state.raised
    edges = tuple(d.nvtx for d in detectors() if d.nvtx and verdicts.get(d.key)
                  and not (before is not None and before.get(d.key)))
    return edges, state._replace(raised=verdicts)


def windows_every(windows: Mapping[str, float]) -> tuple[float, ...]:
    """How often each window is derived again: WINDOW_STALE_SHARE of its length."""
    return tuple(WINDOW_STALE_SHARE * seconds for seconds in windows.values())


def window_kept(at: float, now: float, every: float, interval: float) -> bool:
    """Whether a window derived at `at` still stands: derived under `every` ago (half an interval early, so a
    window due every interval is derived on every sample, whatever the scheduling jitter)."""
    return 0.0 <= now - at < every - interval / 2


def windows_basis_kept(kept: KeptWindows | None, constants: TargetConstants,
                       kv_capacity_tokens: float | None) -> bool:
    """Whether the windows were derived from these constants and KV pool (else each is derived again at once:
    up to WINDOW_STALE_SHARE of its length old, never wrong)."""
    return kept is not None and kept.kv_capacity_tokens == kv_capacity_tokens and kept.constants == constants


def kv_peak_and_queue_floor(state: DetectorState, history: SeriesHistory,
                            first: Point) -> tuple[float | None, float | None, DetectorState]:
    """The highest KV occupancy and the shortest queue from `first` to the newest point.

    Read from the previous sample's where that covered the span: its extremes still in the history and inside
    the span, only the points since are read. At 10 Hz a 10 s window holds a hundred points, and reading each
    one's gauges on every sample was 4% of the agent's CPU (py-spy, 1 target x 10 Hz): each point is another
    object the cache has lost since the previous sample. Points are only ever appended or dropped, so while the
    span starts inside the one read last, the extremes of the points still held are the same, or the span is read
    whole again. Of equal values the newest point is kept: it leaves the span last (a gauge that holds still, an
    idle queue at 0, kept the oldest, which left with the next sample, and the span was read whole every time)."""
    kept, kv, waiting = state.extremes, derive.KV_USAGE, derive.WAITING
    if kept is not None and kept.first <= first.t <= kept.last.t and history.holds(kept.last) and all(
            p is None or (p.t >= first.t and history.holds(p)) for p in (kept.peak, kept.low)):
        peak, low, points = kept.peak, kept.low, history.points_after(kept.last)
    else:
        peak = low = None
        points = list(history.points_since(first))
    for p in points:
        gauges = p.gauges
        value = gauges.get(kv)
        if value is not None and (peak is None or value >= peak.gauges[kv]):
            peak = p
        value = gauges.get(waiting)
        if value is not None and (low is None or value <= low.gauges[waiting]):
            low = p
    last = points[-1] if points else kept.last if kept is not None else first
    extremes = GaugeExtremes(first.t, last, peak, low)
    # (+ 0.0: of a 0 and a -0 the newest may be the -0, where a read of the whole span gives the first of them)
    return (None if peak is None else peak.gauges[kv] + 0.0, None if low is None else low.gauges[waiting] + 0.0,
            state._replace(extremes=extremes))
