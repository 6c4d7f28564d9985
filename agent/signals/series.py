"""The derive step: from one series' history, its target's constants and settings, its detector state and
the time, to the frozen SeriesView the snapshot holds, with the next detector state.

Pure: no I/O, no clock; the sampling loop fetches and bounds the page, remembers it in the history,
calls derive_series once per series and sample, and counts, logs and marks what it returns. Everything
a series exports is computed here: its windows (checked against the GPUs' physics, with what the GPUs
measured over each; each again once it is a sixtieth of its length old, policy.WINDOW_STALE_SHARE), the
detectors' verdicts (their policy in signals/policy.py), the work counters and the capacity signals
(signals/headroom.py).

A derivation that raises on odd inputs (an arithmetic error) gives the series as the engine said it,
without what could not be derived, and says why (`windows_failed`, `signals_failed`): the loop counts
it, so the series is never dropped with its target still up. Windows that raise leave the detector
state as it came in: a half-judged sample carries nothing into the next.

Called again without a new sample (a failed scrape while the last good one is still fresh), it judges
the same history again at the later time: the baselines take at most one value a second, and the work
counters count each interval of the history once.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, NamedTuple

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals import derive, policy
from rooflight.agent.signals.bounds import within_physics
from rooflight.agent.signals.detectors import DetectorInputs, DetectorThresholds, Verdicts, evaluate
from rooflight.agent.signals.headroom import (
    SignalSettings, WindowSignals, gpu_energy_watts, series_signals, window_signals,
)
from rooflight.agent.signals.policy import DetectorState, ItlTail
from rooflight.agent.signals.view import SeriesView
from rooflight.agent.signals.windows import SeriesHistory, mean
from rooflight.collectors.samples import EngineSeries

INITIAL_STATE = DetectorState()
GPU_DRAM = "dram"  # a GPU's DRAM bandwidth utilization (0..1) inside its SeriesHistory (the sampler's)


@dataclass(frozen=True, slots=True)
class DeriveSettings:
    """What the derive step needs of the agent's configuration: fixed for a target's life."""

    windows: Mapping[str, float]  # seconds by name, shortest first: the detectors judge the shortest
    percentiles: tuple[str, ...]
    interval: float  # seconds between samples
    thresholds: DetectorThresholds
    every: tuple[float, ...]  # how often each window is derived again (policy.windows_every)
    tails: policy.TailSpan


def derive_settings(windows: Mapping[str, float], percentiles: tuple[str, ...], interval: float,
                    thresholds: DetectorThresholds) -> DeriveSettings:
    ordered = dict(sorted(windows.items(), key=lambda kv: kv[1]))
    return DeriveSettings(windows=ordered, percentiles=percentiles, interval=interval, thresholds=thresholds,
                          every=policy.windows_every(ordered), tails=policy.tail_span(tuple(windows.values())))


@dataclass(frozen=True, slots=True)
class GpuMeasures:
    """The histories of the target's own GPUs, as NVML measured them (DRAM bandwidth utilization, the
    energy counter): None for a GPU not sampled yet. Read over each window this sample derives, whose
    length can be shorter than configured while the history is young. Empty: no GPU seen."""

    histories: tuple[SeriesHistory | None, ...] = ()

    def over(self, seconds: float) -> tuple[float | None, float | None]:
        """(mean DRAM bandwidth utilization, mean power in watts) of the GPUs over the last `seconds`."""
        return gpu_dram_utilization(self.histories, seconds), _energy_watts(self.histories, seconds)


def gpu_dram_utilization(histories: Iterable[SeriesHistory | None], seconds: float) -> float | None:
    """Measured DRAM bandwidth utilization of the GPUs, time-averaged over the window, then over the GPUs
    that measured it."""
    means = []
    for history in histories:
        span = history.window(seconds) if history else None
        value = mean(*span, GPU_DRAM) if span else None
        if value is not None:
            means.append(value)
    return sum(means) / len(means) if means else None


def _energy_watts(histories: tuple[SeriesHistory | None, ...], seconds: float) -> float | None:
    """Mean power of the GPUs over the window, from NVML's energy counter; None unless every one of them
    reports it (a partial sum would overstate tokens per joule)."""
    if not histories or any(h is None for h in histories):
        return None
    return gpu_energy_watts([h for h in histories if h is not None], seconds)


NO_GPU = GpuMeasures()


@dataclass(frozen=True, slots=True)
class TargetInputs:
    """What one sample of a target brings besides its series' histories: the same for each of its series."""

    constants: TargetConstants
    signal_settings: SignalSettings  # role, SLOs, GPU price
    batch_max_flag: float | None = None  # --batch-max: over what the engine says
    info_batch_max: float | None = None  # the engine's info endpoint's batch cap
    info_settings: Mapping[str, str] = field(default_factory=dict)  # the info endpoint's settings
    gpu: GpuMeasures = NO_GPU
    proxy_judges: bool = False  # a proxy relays the target's streams, and the target has one series
    proxy_itl_worst: float | None = None  # the worst gap it saw over the ITL span (policy.ITL_SPAN_INTERVALS)


@dataclass(frozen=True, slots=True)
class Derived:
    """One series' view, its next detector state, and what the loop counts, logs and marks."""

    view: SeriesView
    state: DetectorState
    dropped: tuple[str, ...] = ()  # a reason per value withheld as physically impossible (derive.py)
    windows_failed: str | None = None  # why the windows or verdicts could not be derived
    signals_failed: str | None = None  # why the capacity signals could not be derived
    rising: tuple[str, ...] = ()  # the NVTX marks of the verdicts that turned on (policy.rising_edges)


def derive_series(series: EngineSeries, history: SeriesHistory | None, target: TargetInputs,
                  settings: DeriveSettings, state: DetectorState, now: float) -> Derived:
    """The series' view on this sample (see the module docstring); `now` is monotonic."""
    dropped: list[str] = []
    windows_failed = signals_failed = None
    try:
        judged, state = _judged(series, history, target, settings, state, now, dropped)
    except (ArithmeticError, ValueError) as exc:
        windows_failed = f"windows of {series.model!r} rank {series.rank!r}: {exc!r}"
        judged = _Judged()
    batch_max = judged.batch_max
    try:
        signals, state = _signals_kept(judged.windows, batch_max, series, target, state)
    except (ArithmeticError, ValueError) as exc:
        signals_failed = f"{series.model!r} rank {series.rank!r}: {exc!r}"
        signals = ()
    view = SeriesView(series=series, windows=judged.windows, verdicts=judged.verdicts, batch_max=batch_max,
                      live_kv_bytes=judged.live_kv_bytes, signals=signals, settings=_settings(target, series),
                      work=judged.work)
    return Derived(view, state, tuple(dropped), windows_failed, signals_failed, judged.rising)


def with_signals(view: SeriesView, constants: TargetConstants | None, settings: SignalSettings) -> SeriesView:
    """The view with its windows' capacity signals (signals/headroom.py), from its target's constants and
    settings; raises ArithmeticError or ValueError on odd inputs."""
    return replace(view, signals=series_signals(view.windows, constants, view.batch_max,
                                                view.series.kv_capacity_tokens, settings))


def _signals_kept(windows: tuple[derive.WindowValues, ...], batch_max: float | None, series: EngineSeries,
                  target: TargetInputs, state: DetectorState) -> tuple[tuple[WindowSignals, ...], DetectorState]:
    """The windows' capacity signals (as with_signals gives them), each window's kept with it while it stands
    (policy.KeptSignals): the same window, batch cap and settings give the same signals, and a 5m window stands
    for five seconds."""
    settings, capacity, constants = target.signal_settings, series.kv_capacity_tokens, target.constants
    kept = state.signals
    if not windows:
        return (), state
    if kept is None or kept.batch_max != batch_max or kept.settings != settings:
        same = {}
    elif len(kept.windows) == len(windows) and all(map(operator.is_, kept.windows, windows)):
        return kept.signals, state
    else:  # each kept window's signals by its id: the kept windows are alive in `kept`, so an id is one of them
        same = {id(w): s for w, s in zip(kept.windows, kept.signals)}
    signals = tuple(same.get(id(w)) or window_signals(w, constants, batch_max, capacity, settings) for w in windows)
    return signals, state._replace(signals=policy.KeptSignals(windows, batch_max, settings, signals))


class _Judged(NamedTuple):
    """What one sample judged of a series: its windows (shortest first), verdicts, batch cap, live KV, work
    counters, and the verdicts that rose."""

    windows: tuple[derive.WindowValues, ...] = ()
    verdicts: Verdicts | None = None
    batch_max: float | None = None
    live_kv_bytes: float | None = None
    work: derive.WorkTotals | None = None
    rising: tuple[str, ...] = ()


def _judged(series: EngineSeries, history: SeriesHistory | None, target: TargetInputs, settings: DeriveSettings,
            state: DetectorState, now: float, dropped: list[str]) -> tuple[_Judged, DetectorState]:
    """The windows, work counters and verdicts of the series, with the state they leave."""
    derived, state = _windows(series, history, target, settings, state, now, dropped)
    windows = tuple(w for w in derived if w is not None)
    state = _count_work(state, history, derived[0] if derived else None)
    batch_max = _first(target.batch_max_flag, series.batch_max_requests, target.info_batch_max)
    live = derive.live_kv_bytes(series.kv_usage_ratio, series.kv_capacity_tokens, target.constants)
    tail, state = policy.itl_tail(state, history, settings.interval, settings.tails, now,
                                  target.proxy_itl_worst, target.proxy_judges)
    verdicts, state = _verdicts(series, windows, history, batch_max, tail, settings.thresholds, state)
    verdicts, state = policy.hold_head_of_line(state, verdicts, now, settings.thresholds.hol_hold_seconds)
    rising, state = policy.rising_edges(state, verdicts)
    return _Judged(windows, verdicts, batch_max, live, state.work, rising), state


def _count_work(state: DetectorState, history: SeriesHistory | None,
                shortest: derive.WindowValues | None) -> DetectorState:
    """The series' work counters with the latest sample's interval added (once per sample)."""
    interval = history.last_interval() if history is not None else None
    if interval is None:
        return state
    return state._replace(work=derive.accumulate_work(state.work, *interval, shortest))


def _windows(series: EngineSeries, history: SeriesHistory | None, target: TargetInputs, settings: DeriveSettings,
             state: DetectorState, now: float,
             dropped: list[str]) -> tuple[tuple[derive.WindowValues | None, ...], DetectorState]:
    """Each window in DeriveSettings.windows' order (None where the history does not cover it), checked against
    the GPUs' physics: as last derived while it stands (policy.window_kept), else derived again."""
    if history is None or not settings.windows:
        return (), state
    kept, constants, capacity = state.windows, target.constants, series.kv_capacity_tokens
    standing = kept if kept is not None and policy.windows_basis_kept(kept, constants, capacity) else None
    at, derived = [], []
    for i, ((name, seconds), every) in enumerate(zip(settings.windows.items(), settings.every)):
        if standing is not None and policy.window_kept(standing.at[i], now, every, settings.interval):
            at.append(standing.at[i])
            derived.append(standing.derived[i])
            continue
        values = derive.derive_window(history, name, seconds, constants, capacity, settings.percentiles)
        if values is not None:
            (values,) = _measured((values,), target.gpu, dropped)
            values = within_physics(values, constants)
        at.append(now)
        derived.append(values)
    if standing is not None and tuple(at) == standing.at:
        return standing.derived, state  # every one stands
    return tuple(derived), state._replace(windows=policy.KeptWindows(tuple(at), constants, capacity, tuple(derived)))


def _measured(windows: tuple[derive.WindowValues, ...], gpu: GpuMeasures,
              dropped: list[str]) -> tuple[derive.WindowValues, ...]:
    """Freshly derived windows with what the GPUs measured over each (DRAM bandwidth, energy); the values
    they withheld noted in `dropped`."""
    dropped.extend(r for w in windows for r in w.dropped)
    if not gpu.histories:
        return windows
    return tuple(_with_gpu_measures(w, *gpu.over(w.seconds)) for w in windows)


def _with_gpu_measures(w: derive.WindowValues, dram: float | None, watts: float | None) -> derive.WindowValues:
    """The window with the GPUs' DRAM utilization and power over it; itself where they are what it holds
    (no GPU seen: both None, on every sample)."""
    if dram == w.dram_utilization and watts == w.energy_watts:
        return w
    return replace(w, dram_utilization=dram, energy_watts=watts)


def _settings(target: TargetInputs, series: EngineSeries) -> dict[str, str]:
    """The engine's settings for one series: its info endpoint's, then its page's for this rank (fresher,
    and per rank), each adapter's fixed list (rooflight_engine_config_info)."""
    return {**target.info_settings, **series.settings}


def _first(*values: float | int | None) -> float | None:
    """The first value given: a flag, then what the engine's metrics say, then its info endpoint."""
    return next((float(v) for v in values if v is not None), None)


def _verdicts(series: EngineSeries, windows: tuple[derive.WindowValues, ...], history: SeriesHistory | None,
              batch_max: float | None, tail: ItlTail, thresholds: DetectorThresholds,
              state: DetectorState) -> tuple[Verdicts | None, DetectorState]:
    """The detectors over the shortest window, against the ITL tail's own recent median."""
    if not windows or history is None:
        return None, state
    short = windows[0]
    span = history.window(short.seconds)
    kv_peak = waiting_low = None
    if span:
        kv_peak, waiting_low, state = policy.kv_peak_and_queue_floor(state, history, span[0])
    inputs = DetectorInputs(
        itl_worst_recent=tail.worst,
        itl_worst_baseline=tail.baseline,
        itl_source=tail.source,
        step_tokens_largest_recent=tail.largest_step,
        step_tokens_largest_baseline=tail.largest_step_baseline,
        prefill_tokens_per_step_short=short.prefill_tokens_per_step,
        kv_usage=series.kv_usage_ratio,
        kv_usage_peak_short=kv_peak,
        preemptions_per_second_short=short.preemptions_per_second,
        running=series.running,
        waiting=series.waiting,
        waiting_min_short=waiting_low,
        batch_max=batch_max,
        **derive.stall_inputs(history, thresholds.stall_seconds),
    )
    return evaluate(inputs, thresholds), state
