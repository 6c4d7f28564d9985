"""One engine target: scrape, normalize, remember, derive; and say plainly when any of it failed.

Bounded per page (docs/reliability.md "Bounds on what an engine can cost"): the body by
max_body_bytes, the samples the adapter may create by collectors.common.page_bounds, label values
by their length; what the bounds cut, and values withheld as physically impossible (a KV occupancy
outside 0..1, MBU or MFU above derive.MAX_UTILIZATION, a counter that keeps going backwards), is
counted in the source's health. So is what the adapters refuse (a histogram of over
expfmt.MAX_HISTOGRAM_BUCKETS buckets, an info value past its plausible bound: common.INFO_OUT_OF_RANGE),
and a derivation that raises on odd inputs (DERIVATION_FAILED): the series is then exported without
what could not be derived, never dropped with the target still `up`.

Strings an engine states (its model path, its families' names) are logged with %r: a newline in them
would otherwise forge a log line.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
from dataclasses import replace
from typing import Any, Callable, Mapping, NamedTuple

import aiohttp

from rooflight.agent.signals import derive
from rooflight.agent.sampling import nvtx_marks
from rooflight.agent.sampling.clock import Clock
from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.signals.baseline import TailBaseline
from rooflight.agent.sampling.discovery import model_from_id
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals.detectors import (
    ITL_FROM_ENGINE,
    ITL_FROM_PROXY,
    DetectorInputs,
    DetectorThresholds,
    Verdicts,
    evaluate,
)
from rooflight.agent.signals.bounds import within_physics
from rooflight.agent.signals.headroom import SignalSettings, role_for
from rooflight.agent.sampling.health import KV_USAGE_OUT_OF_RANGE, SourceState
from rooflight.agent.metrics.snapshot import SeriesView, TargetView
from rooflight.agent.signals.token_gaps import ClientGaps
from rooflight.agent.signals.windows import Point, SeriesHistory, histogram_delta, increase, worst_bound
from rooflight.collectors import engines, expfmt
from rooflight.collectors.common import (
    INFO_OUT_OF_RANGE,
    MAX_BATCH,
    MAX_KV_BLOCK_TOKENS,
    MAX_KV_TOKENS,
    MAX_TENSOR_PARALLEL,
    page_bounds,
)
from rooflight.collectors.engines import EngineAdapter
from rooflight.collectors.errors import ParseError, SourceError
from rooflight.collectors.http import Fetched, fetch_json, fetch_text
from rooflight.collectors.samples import EngineInfoHints, EngineSample, EngineSeries

log = logging.getLogger("rooflight")

DISCOVERY_EVERY_SECONDS = 30.0  # while the model is unknown
INFO_EVERY_SECONDS = 300.0  # batch cap and TP change only with a restart; a restart is a counter reset

# A page larger than this is parsed in a worker thread: a 16 MB page takes ~1 s of pure Python, and on
# the event loop that second would be a second in which /metrics cannot answer.
PARSE_IN_THREAD_CHARS = 512 * 1024

DERIVATION_FAILED = "derivation_failed"  # a series' windows or signals raised (an arithmetic error on odd inputs)
# The reasons this loop counts besides health.VALUE_REASONS: counted from zero, so rates work from the start.
INPUT_REASONS = (expfmt.HISTOGRAM_TOO_MANY_BUCKETS, INFO_OUT_OF_RANGE, DERIVATION_FAILED)

# The windows longer than the shortest are derived again at most this often, and at least every
# LONG_WINDOWS_STALE_SHARE of the shortest of them (docs/metrics.md, Conventions): at 10 Hz a 1m
# window's start and end move by under 2% of it in a second, so deriving it on every sample would cost
# ten times the work for no information. The shortest window, which the detectors judge, is derived
# on every sample.
LONG_WINDOWS_EVERY_SECONDS = 1.0
LONG_WINDOWS_STALE_SHARE = 1 / 60

_MARKED = (
    ("head_of_line", "head-of-line stall"),
    ("capacity_capped", "capacity-capped batch"),
    ("admission_bound", "admission-bound batch"),
)


class _LongWindows(NamedTuple):
    """The windows after the shortest of one series as last derived, and what they were derived from."""

    at: float  # monotonic
    constants: TargetConstants
    kv_capacity_tokens: float | None
    windows: tuple[derive.WindowValues, ...]


class ItlTail(NamedTuple):
    """The worst ITL since the previous sample, its recent median, and which source measured both; and
    the largest step of the last STEP_LOOKBACK_SECONDS with the usual largest step (None where the engine
    does not tell its steps' sizes)."""

    worst: float | None
    baseline: float | None
    source: str
    largest_step: float | None = None
    largest_step_baseline: float | None = None


_STEP_SIZES = "steps"  # the tail baseline of the largest step, beside those of the ITL sources
# The usual largest step: the value 60% of the recent prefill seconds' largest steps stay at or under
# (signals/baseline.py says why not their median; docs/physics.md, section Head-of-line blocking).
STEP_BASELINE_QUANTILE = 0.6
# How far back a step far larger than usual is looked for, against the stall since the previous sample.
STEP_LOOKBACK_SECONDS = 2.0


ConstantsFor = Callable[[TargetConfig, Any, Any], TargetConstants]


class EngineLoop:
    def __init__(
        self,
        target: TargetConfig,
        config: AgentConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        model: Any,
        model_source: str | None,
        constants_for: ConstantsFor,
        dram_for: Callable[[TargetConfig, float], float | None] | None = None,
        energy_for: Callable[[TargetConfig, float], float | None] | None = None,
        client_gaps: ClientGaps | None = None,
    ) -> None:
        self.target, self.config, self.session, self.clock = target, config, session, clock
        self.model, self.model_source = model, model_source
        self._constants_for = constants_for
        self._dram_for = dram_for
        self._energy_for = energy_for
        self.client_gaps = client_gaps  # the proxy's view of this target's streams (`rooflight run --proxy-listen`)
        self._raised: dict[tuple[str, str], Verdicts] = {}
        self.state = SourceState("engine", target.name)
        for reason in INPUT_REASONS:
            self.state.values_dropped.setdefault(reason, 0)
        self._derivation_noted: str | None = None
        self.thresholds = DetectorThresholds(**config.detectors)
        self._adapter: EngineAdapter | None = None if target.engine == "auto" else engines.adapter(target.engine)
        self._histories: dict[tuple[str, str], SeriesHistory] = {}
        self._tails: dict[tuple[str, str], dict[str, TailBaseline]] = {}  # by series, then ITL source
        self._last_stall: dict[tuple[str, str], float] = {}
        self._long: dict[tuple[str, str], _LongWindows] = {}  # by series, derived at most once a second
        self._work: dict[tuple[str, str], derive.WorkTotals] = {}  # by series: the work counters' totals
        self._shortest, self._longer = _split_windows(config.windows)
        self._long_every = min([LONG_WINDOWS_EVERY_SECONDS,
                                *(LONG_WINDOWS_STALE_SHARE * seconds for seconds in self._longer.values())])
        self._next_info = 0.0
        self.hints = EngineInfoHints()
        self.latest: EngineSample | None = None
        self.view = TargetView(target.name, target.url, None, None, model_source)

    def histories(self) -> dict[tuple[str, str], SeriesHistory]:
        """The history of each (model, rank) tracked: what the target costs in memory (tests, diagnostics)."""
        return dict(self._histories)

    @property
    def stale_after(self) -> float:
        return self.config.scrape_timeout + 2 * self.config.interval

    async def sample_once(self) -> None:
        start = self.clock.monotonic()
        try:
            sample, t = await self._scrape()
        except SourceError as exc:
            self.state.fail(exc.reason, str(exc), self.clock.monotonic() - start)
            if isinstance(exc, ParseError) and self.target.engine == "auto":
                self._adapter = None  # the engine may have been replaced: detect again
            self._rebuild_view()
            return
        sample = self._in_range(self._cap_series(sample))
        self.latest = sample
        self._remember(sample, t)
        self.state.ok(self.clock.time(), self.clock.monotonic() - start, self.clock.monotonic())
        await self._refresh_info()
        self._rebuild_view(count_dropped=True)

    async def _fetch(self, path: str) -> Fetched:
        return await fetch_text(
            self.session,
            self.target.url + path,
            timeout=self.config.scrape_timeout,
            max_bytes=self.config.max_body_bytes,
            monotonic=self.clock.monotonic,
        )

    def _metrics_paths(self, adapter: EngineAdapter | None) -> tuple[str, ...]:
        """The user's path; else the adapter's; else, to detect the engine, every path an adapter declares."""
        if self.target.metrics_path:
            return (self.target.metrics_path,)
        return adapter.METRICS_PATHS if adapter is not None else engines.probe_paths()

    async def _scrape(self) -> tuple[EngineSample, float]:
        adapter = self._adapter
        first, *rest = self._metrics_paths(adapter)
        fetched = await self._fetch(first)
        for path in rest:  # JSON where a page was expected: the engine serves its page at another path
            if not engines.is_json(fetched.text):
                break
            fetched = await self._fetch(path)
        if adapter is None:
            adapter = self._adapter = engines.detect(fetched.text)
            log.info("target %s: recognised %s", self.target.name, adapter.ENGINE)
        wall = self.clock.time() - (self.clock.monotonic() - fetched.timestamp)
        text, duration, t = fetched.text, fetched.duration, fetched.timestamp
        del fetched  # the page is freed as soon as it is parsed
        big = len(text) > PARSE_IN_THREAD_CHARS
        try:
            with expfmt.bounded(page_bounds(self.config.max_series)) as bounds:
                if big:
                    sample = await asyncio.to_thread(
                        adapter.parse, text, target=self.target.name, timestamp=wall, duration=duration
                    )
                else:
                    sample = adapter.parse(text, target=self.target.name, timestamp=wall, duration=duration)
        except SourceError:
            raise
        except Exception as exc:  # an adapter bug on odd input is a parse failure, not a crash
            raise ParseError(f"{adapter.ENGINE} adapter could not read the exposition: {exc!r}") from exc
        finally:
            if big:
                del text
                _give_back_freed_memory()
        self._page_bounded(bounds)
        return sample, t

    def _page_bounded(self, bounds: expfmt.Bounds) -> None:
        """What the per-page bounds cut from the page just read, into the source's health (logged when it starts)."""
        state = self.state
        if bounds.samples_dropped and not state.samples_dropped:
            log.warning("target %s: the page holds over %d samples of the families read; %d not read "
                        "(max_series bounds them: %d)", self.target.name, bounds.max_samples,
                        bounds.samples_dropped, self.config.max_series)
        if bounds.labels_truncated and not state.labels_truncated:
            log.warning("target %s: %d label values over %d characters, cut", self.target.name,
                        bounds.labels_truncated, expfmt.MAX_LABEL_VALUE_CHARS)
        state.samples_dropped, state.labels_truncated = bounds.samples_dropped, bounds.labels_truncated
        self._count_refused(bounds)

    def _count_refused(self, bounds: expfmt.Bounds) -> None:
        """What the adapter refused while reading (expfmt.drop_value), into values_dropped by reason."""
        for reason, n in bounds.values_dropped.items():
            self.state.values_dropped[reason] = self.state.values_dropped.get(reason, 0) + n

    def _in_range(self, sample: EngineSample) -> EngineSample:
        """The sample without KV occupancies outside 0..1 (1e308 is not a ratio), nor KV pools, batch caps,
        block sizes or TP past their plausible bounds (collectors.common); each one counted."""
        kept = []
        for series in sample.series:
            usage = series.kv_usage_ratio
            if usage is not None and not 0.0 <= usage <= 1.0:
                self.state.drop_value(KV_USAGE_OUT_OF_RANGE)
                series = replace(series, kv_usage_ratio=None)
            capacity, batch = self._plausible(series.kv_capacity_tokens, MAX_KV_TOKENS), \
                self._plausible(series.batch_max_requests, MAX_BATCH)
            if (capacity, batch) != (series.kv_capacity_tokens, series.batch_max_requests):
                series = replace(series, kv_capacity_tokens=capacity, batch_max_requests=batch)
            kept.append(series)
        info = sample.info
        tp, block = (self._plausible(info.tensor_parallel_size, MAX_TENSOR_PARALLEL),
                     self._plausible(info.kv_block_size_tokens, MAX_KV_BLOCK_TOKENS))
        if (tp, block) != (info.tensor_parallel_size, info.kv_block_size_tokens):
            info = replace(info, tensor_parallel_size=None if tp is None else int(tp), kv_block_size_tokens=block)
        if info is sample.info and all(a is b for a, b in zip(kept, sample.series)):
            return sample  # nothing withheld: the sample as read (the common case, on every sample)
        return replace(sample, series=tuple(kept), info=info)

    def _plausible(self, value: float | None, upper: float) -> float | None:
        """The value if in (0, upper]; else None, counted as INFO_OUT_OF_RANGE when one was stated."""
        if value is None or 0.0 < value <= upper:
            return value
        self.state.drop_value(INFO_OUT_OF_RANGE)
        return None

    def _cap_series(self, sample: EngineSample) -> EngineSample:
        """At most config.max_series (model, rank) series: those already tracked first, then in page order.

        Thousands of models or LoRA adapters on one page would otherwise mean thousands of histories
        and tens of thousands of exported series; the rest are dropped and their number exported.
        """
        cap = self.config.max_series
        dropped = max(0, len(sample.series) - cap)
        if dropped and self.state.series_dropped == 0:
            log.warning("target %s: %d series, over the cap of %d; %d dropped (raise max_series to keep them)",
                        self.target.name, len(sample.series), cap, dropped)
        self.state.series_dropped = dropped
        if not dropped:
            return sample
        known = [s for s in sample.series if (s.model, s.rank) in self._histories]
        new = [s for s in sample.series if (s.model, s.rank) not in self._histories]
        return replace(sample, series=tuple((known + new)[:cap]))

    def _remember(self, sample: EngineSample, t: float) -> None:
        retention = max(self.config.windows.values()) + 2 * self.config.interval + self.config.scrape_timeout
        seen = set()
        regressed: list[str] = []
        for series in sample.series:
            key = (series.model, series.rank)
            seen.add(key)
            dense = min(self.config.windows.values()) + 2 * self.config.interval + self.config.scrape_timeout
            history = self._histories.setdefault(key, SeriesHistory(retention, dense=dense))
            history.append(t, *derive.history_inputs(series))
            regressed.extend(f"{name} ({series.model}, rank {series.rank})" for name in history.regressed_unreliable)
        for key in set(self._histories) - seen:  # a model or rank that disappeared takes its state with it
            del self._histories[key]
            self._tails.pop(key, None)
            self._last_stall.pop(key, None)
            self._long.pop(key, None)
            self._work.pop(key, None)
        if regressed:  # one error per sample, however many counters
            self.state.note("counter_regress", f"counters going backwards repeatedly, their rates withheld: "
                            f"{', '.join(sorted(regressed)[:5])}{' ...' if len(regressed) > 5 else ''}")

    def _rebuild_view(self, count_dropped: bool = False) -> None:
        """The TargetView of the latest sample; with `count_dropped` (once a sample) values withheld are counted."""
        model = self._model_with_engine_dtypes()
        info_tp = self.latest.info.tensor_parallel_size if self.latest else None
        constants = self._constants_for(self.target, model, _first(self.hints.tensor_parallel_size, info_tp))
        # vLLM's hybrid KV-cache manager pages a hybrid model's layers by attention type (docs/physics.md, Live ratios)
        constants = replace(constants, kv_pool_grouped=self._adapter is not None and self._adapter.ENGINE == "vllm")
        fresh = (
            self.latest is not None
            and self.state.last_success_monotonic is not None
            and self.clock.monotonic() - self.state.last_success_monotonic <= self.stale_after
        )
        series = (
            tuple(self._safe_series_view(s, constants, count_dropped) for s in self.latest.series)
            if fresh and self.latest
            else ()
        )
        view = TargetView(
            name=self.target.name,
            url=self.target.url,
            engine=self._adapter.ENGINE if self._adapter else None,
            constants=constants,
            model_source=self.model_source,
            series=series,
            signal_settings=self._signal_settings(),
        )
        if count_dropped:
            for failure in view.signals_failed:
                self._derivation_failed(f"signals of {failure}")
        self.view = view

    def _safe_series_view(self, series: EngineSeries, constants: TargetConstants, count_dropped: bool) -> SeriesView:
        """_series_view; where it raises on odd inputs, the series as the engine said it, the failure counted."""
        try:
            return self._series_view(series, constants, count_dropped)
        except (ArithmeticError, ValueError) as exc:
            if count_dropped:
                self._derivation_failed(f"windows of {series.model!r} rank {series.rank!r}: {exc!r}")
            return SeriesView(series=series, settings=_settings(self.hints, series))

    def _derivation_failed(self, what: str) -> None:
        """Count a derivation that raised (DERIVATION_FAILED); logged when the message changes."""
        self.state.drop_value(DERIVATION_FAILED)
        if what != self._derivation_noted:
            self._derivation_noted = what
            log.warning("target %s: could not derive the %s; exported without them", self.target.name, what)

    def _signal_settings(self) -> SignalSettings:
        """The target's role (its setting, else the engine's info endpoint, else its page), SLOs and GPU
        price, for its signals."""
        t = self.target
        page_role = self.latest.info.role if self.latest is not None else None
        return SignalSettings(role=role_for(t.role, self.hints.role or page_role), ttft_slo=t.ttft_slo, itl_slo=t.itl_slo,
                              gpu_hour_cost=t.gpu_hour_cost)

    def _series_view(self, series: EngineSeries, constants: TargetConstants, count_dropped: bool = False) -> SeriesView:
        key = (series.model, series.rank)
        history = self._histories.get(key)
        shortest = tuple(within_physics(w, constants)
                         for w in self._shortest_window(series, history, constants, count_dropped))
        windows = shortest + tuple(within_physics(w, constants)
                                   for w in self._longer_windows(key, series, history, constants, count_dropped))
        work = self._count_work(key, history, shortest)
        batch_max = _first(self.target.batch_max, series.batch_max_requests, self.hints.batch_max_requests)
        live = derive.live_kv_bytes(series.kv_usage_ratio, series.kv_capacity_tokens, constants)
        tail = self._itl_tail(series, history)
        verdicts = _verdicts(series, windows, history, batch_max, tail, self.thresholds)
        verdicts = self._hold_head_of_line((series.model, series.rank), verdicts)
        self._mark_rising_edges((series.model, series.rank), verdicts)
        return SeriesView(series=series, windows=windows, verdicts=verdicts, batch_max=batch_max, live_kv_bytes=live,
                          settings=_settings(self.hints, series), work=work)

    def _count_work(self, key: tuple[str, str], history: SeriesHistory | None,
                    shortest: tuple[derive.WindowValues, ...]) -> derive.WorkTotals | None:
        """The series' work counters with the latest sample's interval added (once per sample)."""
        interval = history.last_interval() if history is not None else None
        if interval is None:
            return self._work.get(key)
        totals = derive.accumulate_work(self._work.get(key), *interval, shortest[0] if shortest else None)
        self._work[key] = totals
        return totals

    def _shortest_window(self, series: EngineSeries, history: SeriesHistory | None, constants: TargetConstants,
                         count_dropped: bool) -> tuple[derive.WindowValues, ...]:
        """The shortest window, derived on every sample: the detectors judge it."""
        if history is None or self._shortest is None:
            return ()
        name, seconds = self._shortest
        values = derive.derive_window(history, name, seconds, constants, series.kv_capacity_tokens,
                                      self.config.percentiles)
        return self._measured((values,) if values is not None else (), count_dropped)

    def _longer_windows(self, key: tuple[str, str], series: EngineSeries, history: SeriesHistory | None,
                        constants: TargetConstants, count_dropped: bool) -> tuple[derive.WindowValues, ...]:
        """The longer windows, derived again once `_long_every` (at most LONG_WINDOWS_EVERY_SECONDS) has passed,
        or at once when the constants or the KV pool they are derived with changed: up to a second old,
        never wrong."""
        if history is None or not self._longer:
            return ()
        now, kept = self.clock.monotonic(), self._long.get(key)
        # Half an interval early: at 1 Hz every sample derives them, whatever the scheduling jitter.
        if (kept is not None and 0.0 <= now - kept.at < self._long_every - self.config.interval / 2
                and kept.kv_capacity_tokens == series.kv_capacity_tokens and kept.constants == constants):
            return kept.windows
        windows = derive.derive_target(history, self._longer, constants, series.kv_capacity_tokens,
                                       self.config.percentiles)
        windows = self._measured(windows, count_dropped)
        self._long[key] = _LongWindows(now, constants, series.kv_capacity_tokens, windows)
        return windows

    def _measured(self, windows: tuple[derive.WindowValues, ...], count_dropped: bool) -> tuple[derive.WindowValues, ...]:
        """Freshly derived windows with what the GPUs measured over each (DRAM bandwidth, energy); with
        `count_dropped`, the values they withheld counted."""
        if count_dropped:
            for reason in (r for w in windows for r in w.dropped):
                self.state.drop_value(reason)
        dram_for, energy_for, target = self._dram_for, self._energy_for, self.target
        if dram_for is None and energy_for is None:
            return windows
        return tuple(_with_gpu_measures(w, dram_for(target, w.seconds) if dram_for is not None else w.dram_utilization,
                                        energy_for(target, w.seconds) if energy_for is not None else w.energy_watts)
                     for w in windows)

    def _mark_rising_edges(self, key: tuple[str, str], verdicts: Verdicts | None) -> None:
        """An NVTX mark when a detector turns on, so an Nsight Systems capture lines it up with the kernels."""
        if verdicts is None:
            return
        before = self._raised.get(key)
        self._raised[key] = verdicts
        for attr, what in _MARKED:
            if getattr(verdicts, attr) and not (before is not None and getattr(before, attr)):
                nvtx_marks.mark(f"rooflight {what}: {self.target.name} {key[0]} rank {key[1]}")

    def _hold_head_of_line(self, key: tuple[str, str], verdicts: Verdicts | None) -> Verdicts | None:
        now = self.clock.monotonic()
        if verdicts is not None and verdicts.head_of_line:
            self._last_stall[key] = now
        last = self._last_stall.get(key)
        if verdicts is None or last is None or now - last > self.thresholds.hol_hold_seconds:
            return verdicts
        return replace(verdicts, head_of_line=True)

    def _itl_tail(self, series: EngineSeries, history: SeriesHistory | None) -> ItlTail:
        """The worst ITL since the previous sample, the median of that worst over the recent past, and
        their source: the proxy's exact gaps where it relays this target's streams and saw some, else the
        engine's histogram (docs/physics.md, section Head-of-line blocking).

        At the agent's resolution (1 s) one stalled step is a visible share of the tokens, where in a
        10 s or 1 m window its few observations vanish below p99. The proxy cannot tell which model or
        rank a stream ran on, so it judges only a target with one series. With either source, the largest
        recent step against the usual largest one (where the engine tells its steps' sizes) says whether a
        step far larger than usual, a long prompt run whole, came with the stall.
        """
        if history is None:
            return ItlTail(None, None, ITL_FROM_ENGINE)
        now, since = self.clock.monotonic(), 1.5 * self.config.interval
        span = history.window(since)
        delta = histogram_delta(*span, derive.ITL) if span else None
        key = (series.model, series.rank)
        largest = self._largest_step(key, span, history.window(max(since, STEP_LOOKBACK_SECONDS)), now)
        engine = self._tail_against_baseline(key, ITL_FROM_ENGINE, now, worst_bound(delta) if delta else None)
        if self.client_gaps is not None and len(self._histories) == 1:
            proxy = self._tail_against_baseline(key, ITL_FROM_PROXY, now, self.client_gaps.stall_between(now - since, now))
            if proxy.worst is not None and proxy.baseline:  # 0: the streams arrive in bursts, no gaps to judge
                return proxy._replace(largest_step=largest.worst, largest_step_baseline=largest.baseline)
        return engine._replace(largest_step=largest.worst, largest_step_baseline=largest.baseline)

    def _largest_step(self, key: tuple[str, str], span: tuple[Point, Point] | None,
                      lookback: tuple[Point, Point] | None, now: float) -> ItlTail:
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
        tail = self._tail_for(key, _STEP_SIZES, STEP_BASELINE_QUANTILE)
        baseline = tail.median()  # before this value joins: the baseline is the recent past
        tail.add(now, joins)
        return ItlTail(worst_bound(recent) if recent else None, baseline, _STEP_SIZES)

    def _tail_for(self, key: tuple[str, str], source: str, quantile: float = 0.5) -> TailBaseline:
        tails = self._tails.setdefault(key, {})
        tail = tails.get(source)
        if tail is None:
            tail = tails[source] = TailBaseline(keep_seconds=max(self.config.windows.values()),
                                                min_span=3 * min(self.config.windows.values()), quantile=quantile)
        return tail

    def _tail_against_baseline(self, key: tuple[str, str], source: str, now: float, worst: float | None) -> ItlTail:
        tail = self._tail_for(key, source)
        baseline = tail.median()  # before this value joins: the baseline is the recent past
        tail.add(now, worst)
        return ItlTail(worst, baseline, source)

    def _model_with_engine_dtypes(self) -> Any:
        """An fp8 KV cache the engine reports halves KV bytes per token, unless the user said otherwise."""
        model, info = self.model, self.latest.info if self.latest else None
        if model is None or info is None or self.target.kv_dtype or not info.kv_cache_dtype:
            return model
        if info.kv_cache_dtype.startswith("fp8") and model.kv_dtype != "fp8":
            return model.with_dtypes(None, "fp8")
        return model

    async def _refresh_info(self) -> None:
        """Read the engine's info endpoint: its batch cap, model and TP where /metrics does not say.

        Every INFO_EVERY_SECONDS, and every DISCOVERY_EVERY_SECONDS while the model is still unknown.
        """
        now = self.clock.monotonic()
        adapter = self._adapter
        path = adapter.INFO_PATH if adapter is not None else None
        if adapter is None or path is None or now < self._next_info:
            return
        self._next_info = now + (INFO_EVERY_SECONDS if self.model is not None else DISCOVERY_EVERY_SECONDS)
        try:
            data = await fetch_json(self.session, self.target.url + path, timeout=self.config.scrape_timeout)
        except SourceError as exc:
            log.info("target %s: info endpoint %s not readable: %s", self.target.name, path, exc)
            return
        with expfmt.bounded(expfmt.Bounds()) as refused:
            self.hints = adapter.parse_info(data)
        self._count_refused(refused)
        if self.model is not None:
            return
        found = model_from_id(self.hints.model_id, self.target)
        if found is None:
            log.warning("target %s: cannot tell the model's constants from %r; pass --model or --model-config",
                        self.target.name, self.hints.model_id)
            return
        self.model, self.model_source = found
        log.info("target %s: model constants from %r", self.target.name, self.model_source)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None


def _give_back_freed_memory() -> None:
    """Hand the heap pages a big page's buffers freed back to the OS (glibc's malloc_trim).

    glibc raises its mmap threshold to the largest block freed, so after one big page the next one's
    body and text come from the heap and stay resident once freed: without this, RSS ratchets up to
    the sum of what different pages left behind rather than the largest of them (measured peak RSS:
    92-93 MB without, 85-88 MB with, seven 4 MiB pages of different shapes in turn).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _settings(hints: EngineInfoHints, series: EngineSeries) -> dict[str, str]:
    """The engine's settings for one series: its info endpoint's, then its page's for this rank (fresher,
    and per rank), each adapter's fixed list (rooflight_engine_config_info)."""
    return {**hints.settings, **series.settings}


def _with_gpu_measures(w: derive.WindowValues, dram: float | None, watts: float | None) -> derive.WindowValues:
    """The window with the GPUs' DRAM utilization and power over it; itself where they are what it holds
    (no GPU seen: both None, on every sample)."""
    if dram == w.dram_utilization and watts == w.energy_watts:
        return w
    return replace(w, dram_utilization=dram, energy_watts=watts)


def _split_windows(windows: Mapping[str, float]) -> tuple[tuple[str, float] | None, dict[str, float]]:
    """The shortest window (name, seconds), and the others by name (derive_target's order: by length)."""
    ordered = sorted(windows.items(), key=lambda kv: kv[1])
    return (ordered[0] if ordered else None), dict(ordered[1:])


def _first(*values: float | int | None) -> float | None:
    """The first value given: a flag, then what the engine's metrics say, then its info endpoint."""
    return next((float(v) for v in values if v is not None), None)


def _verdicts(
    series: EngineSeries,
    windows: tuple[derive.WindowValues, ...],
    history: SeriesHistory | None,
    batch_max: float | None,
    tail: ItlTail,
    thresholds: DetectorThresholds,
) -> Verdicts | None:
    """The detectors over the shortest window, against the ITL tail's own recent median."""
    if not windows or history is None:
        return None
    short = windows[0]
    span = history.window(short.seconds)
    first = span[0] if span else None
    inputs = DetectorInputs(
        itl_worst_recent=tail.worst,
        itl_worst_baseline=tail.baseline,
        itl_source=tail.source,
        step_tokens_largest_recent=tail.largest_step,
        step_tokens_largest_baseline=tail.largest_step_baseline,
        prefill_tokens_per_step_short=short.prefill_tokens_per_step,
        kv_usage=series.kv_usage_ratio,
        kv_usage_peak_short=derive.maximum(history, first, derive.KV_USAGE) if first else None,
        preemptions_per_second_short=short.preemptions_per_second,
        running=series.running,
        waiting=series.waiting,
        waiting_min_short=derive.minimum(history, first, derive.WAITING) if first else None,
        batch_max=batch_max,
        **derive.stall_inputs(history, thresholds.stall_seconds),
    )
    return evaluate(inputs, thresholds)

