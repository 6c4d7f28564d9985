"""One engine target on its interval: fetch its page (and now and then its info endpoint), normalize the
sample (collectors/normalize.py), hand it to the target's series (target_series.py: histories and the
derive step), and publish its TargetView; say plainly when any of it failed.

Bounded per page (docs/reliability.md "Bounds on what an engine can cost"): the body by max_body_bytes,
the samples the adapter may create by collectors.common.page_bounds, label values by their length. What
the bounds cut, what the adapter refused (a histogram of over expfmt.MAX_HISTOGRAM_BUCKETS buckets, an
info value past its plausible bound) and what normalize withheld are counted in the source's health.
Strings an engine states (its model path, its families' names) are logged with %r: a newline in them
would otherwise forge a log line.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Callable, Mapping

import aiohttp

from rooflight.agent.metrics.snapshot import TargetView
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.sampling import memory
from rooflight.agent.sampling.clock import Clock
from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.sampling.discovery import model_from_id, with_engine_dtypes
from rooflight.agent.sampling.health import SourceState
from rooflight.agent.sampling.target_series import DERIVATION_FAILED, GpuMeasuresFor, TargetSeries
from rooflight.agent.signals.token_gaps import ClientGaps
from rooflight.agent.signals.view import SeriesView
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors import engines, expfmt, normalize
from rooflight.collectors.common import INFO_OUT_OF_RANGE, page_bounds
from rooflight.collectors.engines import EngineAdapter
from rooflight.collectors.errors import ParseError, SourceError
from rooflight.collectors.http import Fetched, PageClient, fetch_json
from rooflight.collectors.samples import EngineInfoHints, EngineSample

log = logging.getLogger("rooflight")

DISCOVERY_EVERY_SECONDS = 30.0  # while the model is unknown
INFO_EVERY_SECONDS = 300.0  # batch cap and TP change only with a restart; a restart is a counter reset

# A page larger than this is parsed in a worker thread: a 16 MB page takes ~1 s of pure Python, and on
# the event loop that second would be a second in which /metrics cannot answer.
PARSE_IN_THREAD_CHARS = 512 * 1024

# The reasons this loop counts besides health.VALUE_REASONS: counted from zero, so rates work from the start.
INPUT_REASONS = (expfmt.HISTOGRAM_TOO_MANY_BUCKETS, INFO_OUT_OF_RANGE, DERIVATION_FAILED, normalize.GAUGE_OUT_OF_RANGE)

ConstantsFor = Callable[[TargetConfig, Any, Any, bool], TargetConstants]


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
        self.client_gaps = client_gaps  # the proxy's view of this target's streams (`rooflight run --proxy-listen`)
        self.state = SourceState("engine", target.name)
        for reason in INPUT_REASONS:
            self.state.values_dropped.setdefault(reason, 0)
        self._adapter: EngineAdapter | None = None if target.engine == "auto" else engines.adapter(target.engine)
        self.series = TargetSeries(target, config, self.state, gpu_measures_for)  # histories, detector states
        self._constants: TargetConstants | None = None  # as the last sample used them (_rebuild_view)
        self._next_info = 0.0
        self.hints = EngineInfoHints()
        self.latest: EngineSample | None = None
        self.view = TargetView(target.name, target.url, None, None, model_source)

    def histories(self) -> dict[tuple[str, str], SeriesHistory]:
        """The history of each (model, rank) tracked: what the target costs in memory (tests, diagnostics)."""
        return dict(self.series.histories)

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
        sample = self._normalized(sample)
        self.latest = sample
        self._remember(sample, t)
        self.state.ok(self.clock.time(), self.clock.monotonic() - start, self.clock.monotonic())
        await self._refresh_info()
        self._rebuild_view(count_dropped=True)

    def close(self) -> None:
        """Close the connection the target's pages are read over (the agent stops)."""
        self._pages.close()

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
        parse = functools.partial(adapter.parse, text, target=self.target.name, timestamp=wall, duration=duration)
        del text  # held by `parse` alone, freed with it
        try:
            with expfmt.bounded(page_bounds(self.config.max_series)) as bounds:
                sample = await asyncio.to_thread(parse) if big else parse()
        except SourceError:
            raise
        except Exception as exc:  # an adapter bug on odd input is a parse failure, not a crash
            raise ParseError(f"{adapter.ENGINE} adapter could not read the exposition: {exc!r}") from exc
        finally:
            del parse
            if big:
                memory.give_back_freed_memory()
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
        self._count(bounds.values_dropped)

    def _count(self, withheld: Mapping[str, int]) -> None:
        """Values refused or withheld (expfmt.drop_value, collectors/normalize.py), into values_dropped by reason."""
        for reason, n in withheld.items():
            self.state.values_dropped[reason] = self.state.values_dropped.get(reason, 0) + n

    def _normalized(self, sample: EngineSample) -> EngineSample:
        """The sample within the per-target series cap and without impossible values (collectors/normalize.py),
        what they withheld counted in the source's health."""
        sample, dropped = normalize.capped(sample, self.config.max_series, self.series.histories)
        if dropped and self.state.series_dropped == 0:
            log.warning("target %s: %d series, over the cap of %d; %d dropped (raise max_series to keep them)",
                        self.target.name, len(sample.series) + dropped, self.config.max_series, dropped)
        self.state.series_dropped = dropped
        sample, withheld = normalize.plausible(sample)
        self._count(withheld)
        return sample

    def _remember(self, sample: EngineSample, t: float) -> None:
        self.series.remember(sample, t)

    def _rebuild_view(self, count_dropped: bool = False) -> None:
        """The TargetView of the latest sample, each series through the derive step (target_series.py); with
        `count_dropped` (once a sample) the values it withheld and the derivations that raised are counted."""
        latest, adapter = self.latest, self._adapter
        model = with_engine_dtypes(self.model, latest.info if latest else None, self.target)
        info_tp = latest.info.tensor_parallel_size if latest else None
        grouped = adapter is not None and adapter.KV_POOL_GROUPED
        constants = self._constants_for(self.target, model, _first(self.hints.tensor_parallel_size, info_tp), grouped)
        if constants == self._constants:  # the instance the last sample used: its peaks are computed already
            constants = self._constants
        self._constants = constants
        now = self.clock.monotonic()
        fresh = latest is not None and self.state.last_success_monotonic is not None \
            and now - self.state.last_success_monotonic <= self.stale_after
        signal_settings = self.series.signal_settings(self.hints, latest)
        views: tuple[SeriesView, ...] = ()
        signals_failed: tuple[str, ...] = ()
        if fresh and latest and latest.series:
            views, signals_failed = self.series.views(latest, constants, self.hints, signal_settings,
                                                      self.client_gaps, now, count_dropped)
        self.view = TargetView(name=self.target.name, url=self.target.url, engine=adapter.ENGINE if adapter else None,
                               constants=constants, model_source=self.model_source, series=views,
                               signal_settings=signal_settings, signals_failed=signals_failed)

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
        self._count(refused.values_dropped)
        if self.model is not None:
            return
        found = model_from_id(self.hints.model_id, self.target)
        if found is None:
            log.warning("target %s: cannot tell the model's constants from %r; pass --model or --model-config",
                        self.target.name, self.hints.model_id)
            return
        self.model, self.model_source = found
        log.info("target %s: model constants from %r", self.target.name, self.model_source)


def _first(*values: float | int | None) -> float | None:
    """The first value given: a flag, then what the engine's metrics say, then its info endpoint."""
    return next((float(v) for v in values if v is not None), None)

