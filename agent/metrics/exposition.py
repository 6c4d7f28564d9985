"""Renders the current Snapshot as Prometheus metrics at scrape time, from the catalogue's families.

`walk` visits the Snapshot's parts in the exposition's order, each with its scope and its labels; every
family of that scope (agent/metrics/catalog.py) reads its value from it. `collect()` only reads a frozen
Snapshot and formats numbers: no I/O, no NVML, no math beyond a division, so a scrape costs the same
whatever the sources are doing. Series for a GPU, model or target that vanished simply stop appearing. A
value that is missing or not finite (or negative, where its family says) is not exported: absent means
"cannot be derived here", never a made-up zero. A family appears where its first series does (the walk's
order); one without series not at all. The families and the Collector are agent/metrics/families.py's,
shared with the proxy's /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from rooflight.agent.metrics import family as fm
from rooflight.agent.metrics.catalog import families
from rooflight.agent.metrics.families import Families, SnapshotCollector, registry_of
from rooflight.agent.metrics.snapshot import Snapshot, TargetView
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.models import ModelSpec
from rooflight.collectors.gpu_map import GpuAssignment
from rooflight.collectors.samples import GpuDevice

Key = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelRow:
    """The constants of one model a target serves (the MODEL scope)."""

    spec: ModelSpec
    source: str  # where they came from: preset:..., config.json:..., discovered:...
    tensor_parallel_size: int


@dataclass(frozen=True, slots=True)
class GpuRow:
    """One GPU the agent exports, or (`device` None) the constants that stand in when none was detected."""

    device: GpuDevice | None
    info: Key  # rooflight_gpu_info's name, profile, source and reason


@dataclass(frozen=True, slots=True)
class TargetGpuRow:
    """A target's GPUs, and each exported GPU's NVML index by UUID."""

    assignment: GpuAssignment
    index: Mapping[str, int]


def walk(snap: Snapshot) -> Iterator[tuple[str, Key, Any]]:
    """(scope, its labels' values, the thing its families read) for every part of the Snapshot, in order."""
    yield fm.AGENT, (), snap
    for h in snap.health:
        yield fm.HEALTH, (h.source, h.target), h
    for target in snap.targets:
        yield from _target(target)
    yield from _gpus(snap)
    index = {d.uuid: d.index for d in snap.gpu.devices} if snap.gpu is not None else {}
    for name, assignment in sorted(snap.target_gpus.items()):
        yield fm.TARGET_GPU, (name,), TargetGpuRow(assignment, index)
    for name, process in sorted(snap.processes.items()):
        yield fm.PROCESS, (name,), process


def _target(target: TargetView) -> Iterator[tuple[str, Key, Any]]:
    for view in target.series:
        s = view.series
        key = (target.name, target.engine or "unknown", s.model, s.rank)
        yield fm.SERIES, key, view
        for w in view.windows:
            yield fm.WINDOW, (*key, w.window), w
        yield fm.SETTINGS, key, view
        for sig in view.signals:
            yield fm.SIGNALS, (*key, sig.window), sig
        if view.verdicts is not None:
            yield fm.VERDICTS, key, view.verdicts
    c = target.constants
    if c is None:
        return
    yield fm.TARGET, (target.name,), target
    if c.model is not None:
        source = target.model_source or c.model.source
        for model in sorted({v.series.model for v in target.series}):
            yield fm.MODEL, (target.name, model), ModelRow(c.model, source, c.tensor_parallel_size)


def _gpus(snap: Snapshot) -> Iterator[tuple[str, Key, GpuRow]]:
    """Each GPU exported; with none, the first target's constants say which stand in."""
    gpu = snap.gpu
    if gpu is None or not gpu.devices:
        for target in snap.targets[:1]:
            c: TargetConstants | None = target.constants
            if c is not None:
                yield fm.GPU, ("none", ""), GpuRow(None, ("not detected", c.gpu_key, c.gpu_source, c.gpu_note))
        return
    for d in gpu.devices:
        info = (d.name, snap.gpu_profiles.get(d.index, "unknown"), "nvml", snap.gpu_notes.get(d.index, ""))
        yield fm.GPU, (str(d.index), d.uuid), GpuRow(d, info)


_SCOPED: dict[int, tuple[tuple[fm.Family, ...], dict[str, tuple[fm.Family, ...]]]] = {}


def _by_scope(catalogue: tuple[fm.Family, ...]) -> dict[str, tuple[fm.Family, ...]]:
    """The catalogue's families by scope, worked out once per catalogue (by identity: hashing it is not free)."""
    kept = _SCOPED.get(id(catalogue))
    if kept is None or kept[0] is not catalogue:
        kept = _SCOPED[id(catalogue)] = (catalogue, {s: tuple(f for f in catalogue if f.scope == s) for s in fm.SCOPES})
    return kept[1]


def render(snap: Snapshot) -> list[Metric]:
    catalogue = families()
    f = Families({d.name: d for d in catalogue})
    by_scope = _by_scope(catalogue)
    for scope, key, thing in walk(snap):
        for family in by_scope[scope]:
            if family.info:
                settings = family.value(thing)
                if settings:
                    f.add_info(family.name, {**settings, **dict(zip(family.labels, key))})
                continue
            for labels, value in family.series(thing):
                f.add(family.name, (*key, *labels) if labels else key, value)
    return list(f)


def api_values(scope: str, thing: Any) -> dict[str, Any]:
    """The values of `thing`'s families that /api/v1/snapshot and /api/v1/status show, by their field names."""
    return {f.api: f.raw(thing) for f in _by_scope(families())[scope] if f.api is not None}


def page_names() -> dict[str, str]:
    """The series of each number the status page shows, by the page's name for it."""
    return {f.page: f.name for f in families() if f.page is not None}


def registry_for(current: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry whose one collector renders whatever Snapshot `current()` returns."""
    return registry_of(SnapshotCollector(current, render))
