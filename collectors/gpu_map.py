"""Which GPUs serve which engine: pure functions that join NVML's process lists with the engine's tree.

Inputs are plain values the collectors already produce: the engine's process-tree PIDs
(ProcessCollector.tree_pids), NVML's running compute processes per GPU UUID
(NvmlCollector.processes) and, as a fallback, the engine's CUDA_VISIBLE_DEVICES. The answer lets
each target's MBU/MFU use the peaks of its own GPUs, and gives the GPU count behind its tensor
parallel size without a flag.

PID namespaces: NVML may report host PIDs while psutil in a sidecar sees the pod's (docs/nvml.md,
section PID namespaces), in which case no PID matches; the fallback then is CUDA_VISIBLE_DEVICES read from the
engine's environment, then "all visible GPUs", and `source` says which rule decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Iterable, Mapping, Sequence


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    """The GPUs of one engine, in NVML order, and how they were found."""

    uuids: tuple[str, ...]
    source: str  # "nvml_pids", "cuda_visible_devices" or "all_visible"


def gpus_by_pid(tree_pids: Collection[int],
                gpu_processes: Mapping[str, Iterable[tuple[int, int | None]]],
                order: Sequence[str]) -> tuple[str, ...]:
    """UUIDs (in `order`) whose compute-process list holds any PID of the engine's tree."""
    pids = set(tree_pids)
    hit = {uuid for uuid, procs in gpu_processes.items() if any(pid in pids for pid, _ in procs)}
    return tuple(u for u in order if u in hit)


def parse_visible_devices(value: str | None, order: Sequence[str]) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES ("0,2", "GPU-8f3c...,GPU-...", "MIG-...") resolved to UUIDs in `order`.

    None when the variable is unset (CUDA then sees every GPU); entries CUDA would reject end the
    list there, as CUDA itself stops at the first invalid entry.
    """
    if value is None:
        return None
    out: list[str] = []
    for item in (x.strip() for x in value.split(",")):
        if item.isdecimal() and int(item) < len(order):
            uuid = order[int(item)]
        else:
            matches = [u for u in order if item and u.startswith(item)]
            if len(matches) != 1:
                break
            uuid = matches[0]
        if uuid not in out:
            out.append(uuid)
    return tuple(out)


def assign_gpus(tree_pids: Collection[int],
                gpu_processes: Mapping[str, Iterable[tuple[int, int | None]]],
                order: Sequence[str],
                cuda_visible_devices: str | None = None) -> GpuAssignment:
    """The engine's GPUs: by PID when NVML shows any of them, else CUDA_VISIBLE_DEVICES, else all."""
    by_pid = gpus_by_pid(tree_pids, gpu_processes, order)
    if by_pid:
        return GpuAssignment(by_pid, "nvml_pids")
    visible = parse_visible_devices(cuda_visible_devices, order)
    if visible is not None:
        return GpuAssignment(visible, "cuda_visible_devices")
    return GpuAssignment(tuple(order), "all_visible")


def tensor_parallel_size(gpu_count: int, *, data_parallel: int = 1, pipeline_parallel: int = 1) -> int | None:
    """GPUs one model copy spans: the engine's GPU count over its DP x PP (None if it does not divide)."""
    ways = data_parallel * pipeline_parallel
    if gpu_count <= 0 or ways <= 0 or gpu_count % ways:
        return None
    return gpu_count // ways
