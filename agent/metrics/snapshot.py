"""The one piece of shared state: a frozen Snapshot, swapped in whole after every sample.

Sampler tasks build it; the exposition Collector, the JSON endpoint and the landing page only read
whichever Snapshot is current, so a scrape never waits on a source and never sees half an update.

Plain data: every number a TargetView holds, its series' capacity signals (signals/headroom.py: headroom,
saturation, capacity, cost, tokens per joule) included, was computed by the derive step
(signals/series.py) once per sample, on the sampling path, so every reader sees the same numbers and a
scrape only formats them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.signals.headroom import SignalSettings
from rooflight.agent.signals.view import SeriesView
from rooflight.collectors.gpu_map import GpuAssignment
from rooflight.collectors.samples import GpuSample, ProcessSample

__all__ = ["EMPTY", "Health", "SeriesView", "Snapshot", "TargetView"]  # SeriesView: signals/view.py's, read here

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
    signals_failed: tuple[str, ...] = ()


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
    starting: bool = False  # the engine's port has refused every connection since the agent started (loading)
    canary: Mapping[str, int] | None = None  # engine sources with --canary: its requests by result (ok, failed)


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
