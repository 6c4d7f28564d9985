"""One engine target: scrape, normalize, remember, and hand each series to the derive step
(signals/series.py) once a sample; and say plainly when any of it failed.

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
import os
from dataclasses import replace
from typing import Any, Callable

import aiohttp

from rooflight.agent.metrics.snapshot import TargetView
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.sampling import nvtx_marks
from rooflight.agent.sampling.canary import Canary
from rooflight.agent.sampling.clock import Clock
from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.sampling.discovery import model_from_id
from rooflight.agent.sampling.health import KV_USAGE_OUT_OF_RANGE, SourceState
from rooflight.agent.signals import derive
from rooflight.agent.signals.detectors import DetectorThresholds
from rooflight.agent.signals.headroom import SignalSettings, role_for
from rooflight.agent.signals.policy import ITL_SPAN_INTERVALS, DetectorState
from rooflight.agent.signals.series import (
    INITIAL_STATE, NO_GPU, GpuMeasures, TargetInputs, derive_series, derive_settings,
)
from rooflight.agent.signals.view import SeriesView
from rooflight.agent.signals.token_gaps import ClientGaps
from rooflight.agent.signals.windows import SeriesHistory
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
from rooflight.collectors.http import Fetched, PageClient, fetch_json
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

ConstantsFor = Callable[[TargetConfig, Any, Any, bool], TargetConstants]
# The target's GPUs as NVML measured them (the sampler's histories of them).
GpuMeasuresFor = Callable[[TargetConfig], GpuMeasures]


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
        gpu_measures_for: GpuMeasuresFor | None = None,
        client_gaps: ClientGaps | None = None,
    ) -> None:
        self.target, self.config, self.session, self.clock = target, config, session, clock
        self._pages = PageClient(session)  # the target's pages over a connection of its own (collectors.http)
        self.model, self.model_source = model, model_source
        self._constants_for = constants_for
        self._gpu_measures_for = gpu_measures_for
        self.client_gaps = client_gaps  # the proxy's view of this target's streams (`rooflight run --proxy-listen`)
        self.state = SourceState("engine", target.name)
        for reason in INPUT_REASONS:
            self.state.values_dropped.setdefault(reason, 0)
        self._derivation_noted: str | None = None
        self.thresholds = DetectorThresholds(**config.detectors)
        self.canary: Canary | None = None
        if config.canary:
            self.state.canary = {}
            self.canary = Canary(session, target.url, self.thresholds.stall_seconds,
                                 self.state.canary, clock.monotonic)
        self._adapter: EngineAdapter | None = None if target.engine == "auto" else engines.adapter(target.engine)
        self._histories: dict[tuple[str, str], SeriesHistory] = {}
        self._states: dict[tuple[str, str], DetectorState] = {}  # by series: what the derive step carries on
        self._derive = derive_settings(config.windows, config.percentiles, config.interval, self.thresholds)
        self._constants: TargetConstants | None = None  # as the last sample used them (_rebuild_view)
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
        if self.canary is not None:
            self.canary.consider([v.series.model for v in self.view.series if v.verdicts and v.verdicts.engine_stalled])

    def close(self) -> None:
        """Close the connection the target's pages are read over, and a canary in flight (the agent stops)."""
        self._pages.close()
        if self.canary is not None:
            self.canary.close()

    async def _fetch(self, path: str) -> Fetched:
        return await self._pages.fetch_text(
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
            self._states.pop(key, None)
        if regressed:  # one error per sample, however many counters
            self.state.note("counter_regress", f"counters going backwards repeatedly, their rates withheld: "
                            f"{', '.join(sorted(regressed)[:5])}{' ...' if len(regressed) > 5 else ''}")

    def _rebuild_view(self, count_dropped: bool = False) -> None:
        """The TargetView of the latest sample, each series through the derive step (signals/series.py);
        with `count_dropped` (once a sample) the values it withheld and the derivations that raised are
        counted."""
        model = self._model_with_engine_dtypes()
        info_tp = self.latest.info.tensor_parallel_size if self.latest else None
        # vLLM's hybrid KV-cache manager pages a hybrid model's layers by attention type (docs/physics.md, Live ratios)
        grouped = self._adapter is not None and self._adapter.ENGINE == "vllm"
        constants = self._constants_for(self.target, model, _first(self.hints.tensor_parallel_size, info_tp), grouped)
        if constants == self._constants:  # the instance the last sample used: its peaks are computed already
            constants = self._constants
        self._constants = constants
        now = self.clock.monotonic()
        fresh = (
            self.latest is not None
            and self.state.last_success_monotonic is not None
            and now - self.state.last_success_monotonic <= self.stale_after
        )
        signal_settings = self._signal_settings()
        views: list[SeriesView] = []
        signals_failed: list[str] = []
        if fresh and self.latest and self.latest.series:
            target = self._target_inputs(constants, signal_settings, now)
            for series in self.latest.series:
                views.append(self._derived(series, target, now, count_dropped, signals_failed))
        if count_dropped:
            for failure in signals_failed:
                self._derivation_failed(f"signals of {failure}")
        self.view = TargetView(name=self.target.name, url=self.target.url,
                               engine=self._adapter.ENGINE if self._adapter else None, constants=constants,
                               model_source=self.model_source, series=tuple(views),
                               signal_settings=signal_settings, signals_failed=tuple(signals_failed))

    def _derived(self, series: EngineSeries, target: TargetInputs, now: float, count_dropped: bool,
                 signals_failed: list[str]) -> SeriesView:
        """One series through the derive step: its state kept, what it withheld or failed counted (with
        `count_dropped`), a rising verdict marked for Nsight Systems, a failure of its signals noted."""
        key = (series.model, series.rank)
        derived = derive_series(series, self._histories.get(key), target, self._derive,
                                self._states.get(key, INITIAL_STATE), now)
        self._states[key] = derived.state
        if count_dropped:
            for reason in derived.dropped:
                self.state.drop_value(reason)
            if derived.windows_failed:
                self._derivation_failed(derived.windows_failed)
        for what in derived.rising:
            nvtx_marks.mark(f"rooflight {what}: {self.target.name} {key[0]} rank {key[1]}")
        if derived.signals_failed:
            signals_failed.append(derived.signals_failed)
        return derived.view

    def _target_inputs(self, constants: TargetConstants, signal_settings: SignalSettings, now: float) -> TargetInputs:
        """What this sample brings to each of the target's series besides its history: the settings, the
        GPUs' measures over the windows, and the proxy's worst gap (it judges a target of one series)."""
        gaps = self.client_gaps
        judges = gaps is not None and len(self._histories) == 1
        since = ITL_SPAN_INTERVALS * self.config.interval
        measures = self._gpu_measures_for
        return TargetInputs(
            constants=constants,
            signal_settings=signal_settings,
            batch_max_flag=self.target.batch_max,
            info_batch_max=self.hints.batch_max_requests,
            info_settings=self.hints.settings,
            gpu=measures(self.target) if measures is not None else NO_GPU,
            proxy_judges=judges,
            proxy_itl_worst=gaps.stall_between(now - since, now) if judges and gaps is not None else None,
        )

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
def _libc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS; Windows has no CDLL(None)): nothing to call
        return None


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
BIG_BLOCK_BYTES = 1 << 20


def map_big_blocks() -> None:
    """Give every block of BIG_BLOCK_BYTES or more (a big page's bytes, text, a long line or label value) a mapping
    of its own, unmapped when freed: RSS then follows what a page holds while it is read, not what glibc kept.

    glibc otherwise raises its mmap threshold to the largest block freed (up to 32 MiB), and from then on such
    blocks come from the heap; a fixed threshold stops that. Measured with tests/collectors/test_bounds.py's RSS
    test, seven 4 MiB pages of different shapes in turn: peak RSS 90-92 MB without, 79-84 with (six runs each).
    A vLLM page (~55 kB a rank) is far under it. Called once, by `rooflight run`; a threshold the operator set
    (MALLOC_MMAP_THRESHOLD_, or glibc.malloc.mmap_threshold in GLIBC_TUNABLES) is left as set."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    mallopt = _libc("mallopt")
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, BIG_BLOCK_BYTES)


def _give_back_freed_memory() -> None:
    """Hand the heap pages a big page's buffers freed back to the OS (glibc's malloc_trim).

    glibc raises its mmap threshold to the largest block freed, so after one big page the next one's
    body and text come from the heap and stay resident once freed: without this, RSS ratchets up to
    the sum of what different pages left behind rather than the largest of them (measured peak RSS:
    92-93 MB without, 85-88 MB with, seven 4 MiB pages of different shapes in turn). Under map_big_blocks the
    threshold holds, and what is left to hand back is the heap's blocks under it (a big page's lines, its samples).
    """
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


def _first(*values: float | int | None) -> float | None:
    """The first value given: a flag, then what the engine's metrics say, then its info endpoint."""
    return next((float(v) for v in values if v is not None), None)

