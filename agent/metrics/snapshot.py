"""The one piece of shared state: a frozen Snapshot, swapped in whole after every sample.

Sampler tasks build it; the exposition Collector, the JSON endpoint and the landing page only read
whichever Snapshot is current, so a scrape never waits on a source and never sees half an update.

A TargetView derives its series' capacity signals (signals/headroom.py: headroom, saturation, capacity,
cost, tokens per joule) when it is built, from its constants, its settings and each series' windows and
batch cap: once per sample, on the sampling path, so every reader sees the same numbers and a scrape
only formats them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals.derive import WindowValues, WorkTotals
from rooflight.agent.signals.headroom import SignalSettings, WindowSignals, series_signals
from rooflight.collectors.gpu_map import GpuAssignment
from rooflight.collectors.samples import EngineSeries, GpuSample, ProcessSample


@dataclass(frozen=True, slots=True)
class SeriesView:
    """One (model, rank) of one target: the engine's latest values and what the agent derived."""

    series: EngineSeries
    windows: tuple[WindowValues, ...] = ()
    verdicts: Any = None  # rooflight.agent.signals.detectors.Verdicts when the detectors ran
    batch_max: float | None = None
    live_kv_bytes: float | None = None
    signals: tuple[WindowSignals, ...] = ()  # one per window; set by the TargetView that holds this view
    # The engine's memory and scheduler settings (its page's for this rank, over its info endpoint's),
    # as label name -> value: rooflight_engine_config_info.
    settings: Mapping[str, str] = field(default_factory=dict)
    work: WorkTotals | None = None  # bytes and FLOPs as MBU and MFU count them, since the agent began (counters)


DEFAULT_SIGNAL_SETTINGS = SignalSettings()


@dataclass(frozen=True, slots=True)
class TargetView:
    name: str
    url: str
    engine: str | None
    constants: TargetConstants | None
    model_source: str | None
    series: tuple[SeriesView, ...] = ()
    signal_settings: SignalSettings = DEFAULT_SIGNAL_SETTINGS  # role, SLOs, GPU price: from the target's config
    # Series whose signals could not be derived (an arithmetic error on odd inputs): exported without
    # them, and counted by the engine loop, rather than failing the whole sample and vanishing the target.
    signals_failed: tuple[str, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        """Every series' signals, from this target's constants and settings (see the module docstring)."""
        failed: list[str] = []
        object.__setattr__(self, "series", tuple(self._with_signals(v, failed) for v in self.series))
        object.__setattr__(self, "signals_failed", tuple(failed))

    def _with_signals(self, view: SeriesView, failed: list[str]) -> SeriesView:
        """The series view with its signals; unchanged, its error noted in `failed`, where deriving them raised."""
        try:
            signals = series_signals(view.windows, self.constants, view.batch_max, view.series.kv_capacity_tokens,
                                     self.signal_settings)
        except (ArithmeticError, ValueError) as exc:
            failed.append(f"{view.series.model!r} rank {view.series.rank!r}: {exc!r}")
            return view
        return replace(view, signals=signals)


@dataclass(frozen=True, slots=True)
class Health:
    source: str  # engine, nvml, process
    target: str
    up: bool
    last_success: float | None  # unix seconds
    duration: float | None
    errors: Mapping[str, int]
    message: str | None = None
    series_dropped: int | None = None  # engine sources: series over the per-target cap in the last sample
    # Engine sources (None elsewhere): bounds on the last page, and values withheld as impossible.
    samples_dropped: int | None = None  # wanted exposition samples past the per-page cap, not read
    labels_truncated: int | None = None  # label values cut to the maximum length
    values_dropped: Mapping[str, int] = field(default_factory=dict)  # by reason, since start
    starting: bool = False  # no good sample yet since the agent started (an engine still loading)


@dataclass(frozen=True, slots=True)
class Snapshot:
    created: float
    targets: tuple[TargetView, ...] = ()
    health: tuple[Health, ...] = ()
    gpu: GpuSample | None = None  # the GPUs this agent exports: its targets' own, or every one with `gpus: all`
    gpu_profiles: Mapping[int, str] = field(default_factory=dict)  # NVML index -> profile key ("unknown")
    gpu_notes: Mapping[int, str] = field(default_factory=dict)  # NVML index -> why it is unknown
    target_gpus: Mapping[str, GpuAssignment] = field(default_factory=dict)  # target name -> its GPUs and the rule
    processes: Mapping[str, ProcessSample] = field(default_factory=dict)  # by target name


EMPTY = Snapshot(created=0.0)
