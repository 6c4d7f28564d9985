"""What the engine loop keeps of one target between samples: each (model, rank)'s history and detector state,
and the derive step over them (signals/series.py) once a sample.

The loop fetches and normalizes a page and hands it here: `remember` appends each series to its history
(a model or rank that disappeared takes its state with it), `views` puts each series of the latest sample
through the derive step and counts, in the target's source health, what it withheld as physically
impossible and the derivations that raised (DERIVATION_FAILED: the series is exported without what could
not be derived, never dropped with the target still `up`). A verdict that turned on leaves the NVTX mark
its detector declares, so an Nsight Systems capture lines the detector up with the kernels.
"""

from __future__ import annotations

import logging
from typing import Callable

from rooflight.agent.config.agent import AgentConfig, TargetConfig
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.sampling import nvtx_marks
from rooflight.agent.sampling.health import SourceState
from rooflight.agent.signals import derive
from rooflight.agent.signals.detectors import DetectorThresholds
from rooflight.agent.signals.exported import ExportedCounters, counter_bounds
from rooflight.agent.signals.headroom import SignalSettings, role_for
from rooflight.agent.signals.policy import ITL_SPAN_INTERVALS, DetectorState
from rooflight.agent.signals.series import (
    INITIAL_STATE, NO_GPU, GpuMeasures, TargetInputs, derive_series, derive_settings,
)
from rooflight.agent.signals.token_gaps import ClientGaps
from rooflight.agent.signals.view import SeriesView
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.samples import EngineInfoHints, EngineSample, EngineSeries

log = logging.getLogger("rooflight")

DERIVATION_FAILED = "derivation_failed"  # a series' windows or signals raised (an arithmetic error on odd inputs)

# The target's GPUs as NVML measured them (the sampler's histories of them).
GpuMeasuresFor = Callable[[TargetConfig], GpuMeasures]


class TargetSeries:
    """Each (model, rank) of one target: its history, its detector state, and its view on each sample."""

    def __init__(self, target: TargetConfig, config: AgentConfig, state: SourceState,
                 gpu_measures_for: GpuMeasuresFor | None = None) -> None:
        self.target, self.config, self.state = target, config, state
        self._gpu_measures_for = gpu_measures_for
        self.thresholds = DetectorThresholds(**config.detectors)
        self._derive = derive_settings(config.windows, config.percentiles, config.interval, self.thresholds)
        self.histories: dict[tuple[str, str], SeriesHistory] = {}
        self._states: dict[tuple[str, str], DetectorState] = {}  # by series: what the derive step carries on
        self._exported: dict[tuple[str, str], ExportedCounters] = {}  # by series: its counters as re-exported
        self._derivation_noted: str | None = None

    def remember(self, sample: EngineSample, t: float) -> None:
        """Each series of `sample` into its history; counters that keep going backwards noted once a sample."""
        slack = 2 * self.config.interval + self.config.scrape_timeout
        retention, dense = max(self.config.windows.values()) + slack, min(self.config.windows.values()) + slack
        seen = set()
        regressed: list[str] = []
        for series in sample.series:
            key = (series.model, series.rank)
            seen.add(key)
            history = self.histories.setdefault(key, SeriesHistory(retention, dense=dense))
            history.append(t, *derive.history_inputs(series))
            regressed.extend(f"{name} ({series.model}, rank {series.rank})" for name in history.regressed_unreliable)
        for key in set(self.histories) - seen:  # a model or rank that disappeared takes its state with it
            del self.histories[key]
            self._states.pop(key, None)
            self._exported.pop(key, None)
        if regressed:  # one error per sample, however many counters
            self.state.note("counter_regress", f"counters going backwards repeatedly, their rates withheld: "
                            f"{', '.join(sorted(regressed)[:5])}{' ...' if len(regressed) > 5 else ''}")

    def views(self, sample: EngineSample, constants: TargetConstants, hints: EngineInfoHints,
              signal_settings: SignalSettings, client_gaps: ClientGaps | None, now: float,
              count_dropped: bool) -> tuple[tuple[SeriesView, ...], tuple[str, ...]]:
        """Each series of `sample` through the derive step, and the series whose signals failed; with
        `count_dropped` (once a sample) the values withheld and the derivations that raised are counted."""
        target = self._target_inputs(constants, hints, signal_settings, client_gaps, now)
        bounds = counter_bounds(constants)
        views, signals_failed = [], []
        for series in sample.series:
            series = self._as_exported(series, bounds)
            views.append(self._derived(series, target, now, count_dropped, signals_failed))
        if count_dropped:
            for failure in signals_failed:
                self._derivation_failed(f"signals of {failure}")
        return tuple(views), tuple(signals_failed)

    def _as_exported(self, series: EngineSeries, bounds: dict[str, float]) -> EngineSeries:
        """The series with its counters as the agent re-exports them (signals/exported.py): never growing
        faster than the physics its gauges are held to, a reset still a reset."""
        key = (series.model, series.rank)
        history = self.histories.get(key)
        latest = history.latest if history is not None else None
        if latest is None:
            return series
        return self._exported.setdefault(key, ExportedCounters()).series(series, latest.t, bounds)

    def signal_settings(self, hints: EngineInfoHints, sample: EngineSample | None) -> SignalSettings:
        """The target's role (its setting, else the engine's info endpoint, else its page), SLOs and GPU
        price, for its signals."""
        t = self.target
        page_role = sample.info.role if sample is not None else None
        return SignalSettings(role=role_for(t.role, hints.role or page_role), ttft_slo=t.ttft_slo, itl_slo=t.itl_slo,
                              gpu_hour_cost=t.gpu_hour_cost)

    def _derived(self, series: EngineSeries, target: TargetInputs, now: float, count_dropped: bool,
                 signals_failed: list[str]) -> SeriesView:
        """One series through the derive step: its state kept, what it withheld or failed counted (with
        `count_dropped`), a rising verdict marked for Nsight Systems, a failure of its signals noted."""
        key = (series.model, series.rank)
        derived = derive_series(series, self.histories.get(key), target, self._derive,
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

    def _target_inputs(self, constants: TargetConstants, hints: EngineInfoHints, signal_settings: SignalSettings,
                       gaps: ClientGaps | None, now: float) -> TargetInputs:
        """What this sample brings to each of the target's series besides its history: the settings, the
        GPUs' measures over the windows, and the proxy's worst gap (it judges a target of one series)."""
        judges = gaps is not None and len(self.histories) == 1
        since = ITL_SPAN_INTERVALS * self.config.interval
        measures = self._gpu_measures_for
        return TargetInputs(
            constants=constants,
            signal_settings=signal_settings,
            batch_max_flag=self.target.batch_max,
            info_batch_max=hints.batch_max_requests,
            info_settings=hints.settings,
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
