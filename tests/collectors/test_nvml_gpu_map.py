"""rooflight.collectors.gpu_map: engine PIDs x NVML process lists -> the engine's GPUs."""

from __future__ import annotations

import pytest

from rooflight.collectors.gpu_map import assign_gpus, gpus_by_pid, parse_visible_devices, tensor_parallel_size
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import h100_like

ORDER = ("GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd")
PROCS = {"GPU-aaa": ((10, 1),), "GPU-bbb": ((11, 1), (99, 1)), "GPU-ccc": ((50, 1),), "GPU-ddd": ()}


def test_gpus_by_pid_keeps_nvml_order() -> None:
    assert gpus_by_pid({11, 10, 7}, PROCS, ORDER) == ("GPU-aaa", "GPU-bbb")
    assert gpus_by_pid({50}, PROCS, ORDER) == ("GPU-ccc",)
    assert gpus_by_pid({1234}, PROCS, ORDER) == ()


@pytest.mark.parametrize("value,expected", [
    (None, None), ("", ()), ("1,3", ("GPU-bbb", "GPU-ddd")), ("GPU-c", ("GPU-ccc",)),
    ("2,GPU-aaa", ("GPU-ccc", "GPU-aaa")), ("0,9,1", ("GPU-aaa",)), ("GPU-", ()), ("0,0", ("GPU-aaa",)),
])
def test_parse_visible_devices(value: str | None, expected: tuple[str, ...] | None) -> None:
    assert parse_visible_devices(value, ORDER) == expected


def test_assign_prefers_pids_then_env_then_all() -> None:
    a = assign_gpus({10, 11}, PROCS, ORDER, "3")
    assert (a.uuids, a.source) == (("GPU-aaa", "GPU-bbb"), "nvml_pids")
    a = assign_gpus({4242}, PROCS, ORDER, "3")  # PID namespace mismatch: nothing matches
    assert (a.uuids, a.source) == (("GPU-ddd",), "cuda_visible_devices")
    a = assign_gpus({4242}, PROCS, ORDER, None)
    assert (a.uuids, a.source) == (ORDER, "all_visible")


def test_tensor_parallel_size() -> None:
    assert tensor_parallel_size(4) == 4
    assert tensor_parallel_size(8, data_parallel=2) == 4
    assert tensor_parallel_size(8, data_parallel=2, pipeline_parallel=2) == 2
    assert tensor_parallel_size(6, data_parallel=4) is None
    assert tensor_parallel_size(0) is None


async def test_joins_with_the_nvml_collector() -> None:
    fake = h100_like(4)
    for i, gpu in enumerate(fake.gpus):
        gpu.processes = [(100 + i % 2, 1 << 30)]  # two engines, two GPUs each
    c = NvmlCollector(fake, clock=lambda: 1.0)
    s = await c.sample()
    order = [d.uuid for d in s.devices]
    a = assign_gpus({100, 7}, c.processes, order)
    assert a.uuids == ("GPU-h100-0000", "GPU-h100-0002")
    assert tensor_parallel_size(len(a.uuids)) == 2
