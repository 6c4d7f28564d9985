"""A fake NVML with pynvml's own function surface, for tests and the demo's simulated GPU.

The NVML collector talks to "a module with pynvml's functions", so this fake implements the
functions the collector calls, with pynvml's signatures and pynvml's error classes
(`pynvml.NVMLError(code)`). Constants, structs and error classes are pynvml's own (attribute access
falls through to the real module); any pynvml *function* the fake does not implement raises
NVML_ERROR_FUNCTION_NOT_FOUND, which is exactly what an old driver does.

State is mutable on purpose: tests and the demo set `FakeGpu` fields between samples. A reading set
to None means "this GPU does not support it" (NVML_ERROR_NOT_SUPPORTED). Faults are injected with
`fail_call`, `hang_call`, `gpu_lost` and the `init_error` constructor argument. `calls` counts every
call by function name, so tests can check what the collector stopped asking for.
"""

from __future__ import annotations

import ctypes
import inspect
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

MIB = 1024 * 1024


@dataclass
class FakeMig:
    """One MIG device (a compute instance of a GPU instance) of a FakeGpu."""

    uuid: str
    name: str
    gpu_instance_id: int
    memory_total: int
    memory_used: int = 0
    memory_reserved: int = 0
    dram_bw_util_percent: float | None = None  # GPM per GPU instance (None = unsupported)
    sm_util_percent: float | None = None
    processes: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class FakeGpu:
    """One physical GPU. Units are NVML's native ones (percent, MHz, mW, mJ) unless named."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    memory_reserved: int = 479 * MIB
    gpu_util_percent: float | None = 0.0  # kernel residency, nvmlDeviceGetUtilizationRates().gpu
    mem_util_percent: float | None = 0.0  # memory duty cycle, nvmlDeviceGetUtilizationRates().memory
    gpm: bool = False  # nvmlGpmQueryDeviceSupport().isSupportedDevice
    dram_bw_util_percent: float | None = None
    graphics_util_percent: float | None = None
    sm_util_percent: float | None = None
    sm_occupancy_percent: float | None = None
    tensor_util_percent: float | None = None
    pcie_tx_bytes_per_second: float | None = None  # served by GPM (MiB/s) and the legacy call (KB/s)
    pcie_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_per_second: float | None = None  # GPM only
    nvlink_rx_bytes_per_second: float | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_event_reasons: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    energy_mj: int | None = None
    temperature_c: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = None  # (correctable, uncorrectable, pending, failure)
    xid_events: list[int] = field(default_factory=list)  # pending XIDs, drained by nvmlEventSetWait
    xid_supported: bool = False
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used_gpu_memory bytes)
    mig: list[FakeMig] | None = None  # None = MIG disabled

    def run_for(self, seconds: float) -> None:
        """Let `seconds` pass at the current power draw: the energy counter (mJ) grows by power x time,
        as NVML's nvmlDeviceGetTotalEnergyConsumption does. Nothing changes where either is unsupported."""
        if self.energy_mj is not None and self.power_mw is not None and seconds > 0:
            self.energy_mj += round(self.power_mw * seconds)


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None  # index into FakeGpu.mig


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _need(value: Any) -> Any:
    if value is None:
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return value


class FakeNvml:
    """pynvml's function surface over a list of FakeGpu."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None,
                 driver_version: str = "590.48.01") -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.driver_version = driver_version
        self.initialized = False
        self.calls: Counter[str] = Counter()
        self._fail: dict[tuple[str, int | None], int] = {}
        self._hang: dict[str, float] = {}
        self._release = threading.Event()
        self._lost: set[int] = set()
        self._samples: dict[int, tuple[Any, dict[int, Any] | None, int, int]] = {}  # addr -> (buf, snapshot, seq, prev seq)
        self._seq = 0
        self._last_seq: dict[tuple[int, int | None], int] = {}  # (gpu, instance) -> seq of its latest sample
        self._event_sets: dict[int, list[int]] = {}  # id -> registered gpu indices

    # -- fault injection -------------------------------------------------------------------
    def fail_call(self, name: str, code: int, index: int | None = None) -> None:
        """Make `name` raise NVMLError(code) (on every device, or only on GPU `index`)."""
        self._fail[(name, index)] = code

    def clear_failures(self) -> None:
        self._fail.clear()

    def hang_call(self, name: str, seconds: float) -> None:
        """Make `name` block for up to `seconds` (until `release()`), like a wedged driver."""
        self._hang[name] = seconds
        self._release.clear()

    def release(self) -> None:
        self._hang.clear()
        self._release.set()

    def gpu_lost(self, index: int) -> None:
        """GPU `index` fell off the bus: every call on its handles raises GPU_IS_LOST."""
        self._lost.add(index)

    # -- plumbing --------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        attr = getattr(pynvml, name)
        if name.startswith("nvml") and inspect.isfunction(attr):
            def missing(*_args: Any, **_kwargs: Any) -> Any:
                raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return missing
        return attr

    def _enter(self, name: str, handle: _Handle | None = None) -> None:
        self.calls[name] += 1
        if name in self._hang:
            self._release.wait(self._hang[name])
        if name != "nvmlInit" and not self.initialized:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        index = handle.index if handle is not None else None
        for key in ((name, None), (name, index)):
            if key in self._fail and (key[1] is None or index is not None):
                raise _err(self._fail[key])
        if handle is not None and handle.index in self._lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _gpu(self, h: _Handle) -> FakeGpu:
        return self.gpus[h.index]

    def _target(self, h: _Handle) -> FakeGpu | FakeMig:
        gpu = self.gpus[h.index]
        return gpu if h.mig is None else (gpu.mig or [])[h.mig]

    # -- init, identity --------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return self._target(handle).name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self._target(handle).uuid

    # -- MIG -------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        mode = int(self._gpu(handle).mig is not None)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if self._gpu(handle).mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(self._gpu(handle).mig or []):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(handle.index, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        target = self._target(handle)
        if not isinstance(target, FakeMig):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return target.gpu_instance_id

    # -- memory, utilization, processes ----------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        t = self._target(handle)
        free = t.memory_total - t.memory_used - t.memory_reserved
        if version is None:  # v1: `used` includes reserved
            return SimpleNamespace(total=t.memory_total, free=free, used=t.memory_used + t.memory_reserved)
        return SimpleNamespace(version=version, total=t.memory_total, reserved=t.memory_reserved,
                               free=free, used=t.memory_used)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig is not None or self._gpu(handle).mig is not None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)  # NVML: not supported under MIG
        g = self._gpu(handle)
        return SimpleNamespace(gpu=int(_need(g.gpu_util_percent)), memory=int(_need(g.mem_util_percent)))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF)
                for pid, used in self._target(handle).processes]

    # -- clocks, power, thermals, health ---------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: _Handle, type: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", handle)
        g = self._gpu(handle)
        if type == pynvml.NVML_CLOCK_SM:
            return _need(g.clock_sm_mhz)
        if type == pynvml.NVML_CLOCK_MEM:
            return _need(g.clock_mem_mhz)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return _need(self._gpu(handle).clock_event_reasons)

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", handle)
        return _need(self._gpu(handle).power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", handle)
        return _need(self._gpu(handle).power_limit_mw)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        return _need(self._gpu(handle).energy_mj)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", handle)
        return _need(self._gpu(handle).temperature_c)

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int, counterType: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle)
        g = self._gpu(handle)
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return _need(g.ecc_corrected)
        return _need(g.ecc_uncorrected)

    def nvmlDeviceGetRemappedRows(self, device: _Handle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", device)
        return _need(self._gpu(device).remapped_rows)

    def nvmlDeviceGetPcieThroughput(self, device: _Handle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", device)
        g = self._gpu(device)
        value = g.pcie_tx_bytes_per_second if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_bytes_per_second
        return int(_need(value) / 1024)  # NVML reports KB/s

    # -- XID events ------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        es = len(self._event_sets) + 1
        self._event_sets[es] = []
        return es

    def nvmlDeviceRegisterEvents(self, handle: _Handle, eventTypes: int, eventSet: int) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)
        if not self._gpu(handle).xid_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._event_sets[eventSet].append(handle.index)

    def nvmlEventSetWait(self, eventSet: int, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait")
        for index in self._event_sets.get(eventSet, []):
            if index in self._lost:
                raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
            if self.gpus[index].xid_events:
                xid = self.gpus[index].xid_events.pop(0)
                return SimpleNamespace(device=_Handle(index), eventType=pynvml.nvmlEventTypeXidCriticalError,
                                       eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        raise _err(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: int) -> None:
        self._enter("nvmlEventSetFree")
        self._event_sets.pop(eventSet, None)

    # -- GPM -------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: _Handle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", device)
        return SimpleNamespace(version=1, isSupportedDevice=int(self._gpu(device).gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        buf = ctypes.create_string_buffer(16)
        ptr = ctypes.cast(buf, pynvml.c_nvmlGpmSample_t)
        self._samples[ctypes.addressof(buf)] = (buf, None, 0, 0)
        return ptr

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        if self._samples.pop(self._addr(gpmSample), None) is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmSampleGet(self, device: _Handle, gpmSample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", device)
        self._fill(gpmSample, self._gpm_snapshot(self._target(device), self._gpu(device)), (device.index, None))
        return gpmSample

    def nvmlGpmMigSampleGet(self, device: _Handle, gpuInstanceId: int, gpmSample: Any) -> Any:
        self._enter("nvmlGpmMigSampleGet", device)
        gpu = self._gpu(device)
        for mig in gpu.mig or []:
            if mig.gpu_instance_id == gpuInstanceId:
                self._fill(gpmSample, self._gpm_snapshot(mig, gpu), (device.index, gpuInstanceId))
                return gpmSample
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        """Fills each requested metric from sample2's snapshot.

        Insists that sample1 is the sample of the same device taken just before sample2, so a caller
        that does not alternate its two buffers (and so measures from a stale baseline) fails here.
        """
        self._enter("nvmlGpmMetricsGet")
        first = self._samples.get(self._addr(metricsGet.sample1))
        second = self._samples.get(self._addr(metricsGet.sample2))
        if first is None or second is None or first[1] is None or second[1] is None or first[2] != second[3]:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        snapshot = second[1]
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            value = snapshot.get(metric.metricId)
            metric.nvmlReturn = pynvml.NVML_SUCCESS if value is not None else pynvml.NVML_ERROR_NOT_SUPPORTED
            metric.value = float(value) if value is not None else 0.0
        return metricsGet

    @staticmethod
    def _addr(sample: Any) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value or 0

    def _fill(self, sample: Any, snapshot: dict[int, float | None], key: tuple[int, int | None]) -> None:
        addr = self._addr(sample)
        if addr not in self._samples:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._seq += 1
        self._samples[addr] = (self._samples[addr][0], snapshot, self._seq, self._last_seq.get(key, -1))
        self._last_seq[key] = self._seq

    @staticmethod
    def _gpm_snapshot(t: FakeGpu | FakeMig, gpu: FakeGpu) -> dict[int, float | None]:
        if not gpu.gpm:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

        def mib(v: float | None) -> float | None:
            return None if v is None else v / MIB

        snap: dict[int, float | None] = {
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: t.dram_bw_util_percent,
            pynvml.NVML_GPM_METRIC_SM_UTIL: t.sm_util_percent,
        }
        if isinstance(t, FakeGpu):
            snap.update({
                pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: t.graphics_util_percent,
                pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: t.sm_occupancy_percent,
                pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: t.tensor_util_percent,
                pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: mib(t.pcie_tx_bytes_per_second),
                pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: mib(t.pcie_rx_bytes_per_second),
                pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: mib(t.nvlink_tx_bytes_per_second),
                pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: mib(t.nvlink_rx_bytes_per_second),
            })
        return snap


def h100_like(count: int = 1) -> FakeNvml:
    """Hopper: GPM supported, every reading present (the numbers are an idle-ish H100 SXM)."""
    gpus = [FakeGpu(
        name="NVIDIA H100 80GB HBM3", uuid=f"GPU-h100-{i:04d}", memory_total=81559 * MIB,
        memory_used=60000 * MIB, memory_reserved=479 * MIB, gpu_util_percent=97.0, mem_util_percent=60.0,
        gpm=True, dram_bw_util_percent=55.0, graphics_util_percent=97.0, sm_util_percent=80.0,
        sm_occupancy_percent=25.0, tensor_util_percent=30.0,
        pcie_tx_bytes_per_second=2 * MIB, pcie_rx_bytes_per_second=8 * MIB,
        nvlink_tx_bytes_per_second=1000 * MIB, nvlink_rx_bytes_per_second=1200 * MIB,
        clock_sm_mhz=1980, clock_mem_mhz=2619, clock_event_reasons=0, power_mw=550_000,
        power_limit_mw=700_000, energy_mj=123_456_789, temperature_c=61, ecc_corrected=0, ecc_uncorrected=0,
        remapped_rows=(0, 0, 0, 0), xid_supported=True, processes=[(4242, 59000 * MIB)],
    ) for i in range(count)]
    return FakeNvml(gpus)


def a100_like(count: int = 1) -> FakeNvml:
    """Ampere: no GPM (so no SM/tensor/DRAM-bandwidth/NVLink rates); legacy PCIe throughput works."""
    gpus = [FakeGpu(
        name="NVIDIA A100-SXM4-80GB", uuid=f"GPU-a100-{i:04d}", memory_total=81920 * MIB,
        memory_used=70000 * MIB, memory_reserved=600 * MIB, gpu_util_percent=99.0, mem_util_percent=70.0,
        gpm=False, pcie_tx_bytes_per_second=4 * 1024 * 1024, pcie_rx_bytes_per_second=16 * 1024 * 1024,
        clock_sm_mhz=1410, clock_mem_mhz=1593, clock_event_reasons=0x4, power_mw=380_000,
        power_limit_mw=400_000, energy_mj=9_876_543, temperature_c=55, ecc_corrected=3, ecc_uncorrected=0,
        remapped_rows=(1, 0, 0, 0), xid_supported=True, processes=[(5151, 69000 * MIB)],
    ) for i in range(count)]
    return FakeNvml(gpus)
