"""The NVML collector: every visible GPU (and MIG device) as one GpuSample.

The backend seam is pynvml's own function surface: `lib` is the `pynvml` module in production and
a `rooflight.collectors.nvml_fake.FakeNvml` in tests, so depth only ever adds calls.

Failure policy (docs/nvml.md, section Failure policy):
- NVML unusable (library missing, driver not loaded, init or enumeration failed) raises
  SourceError("nvml", ...): a normal state, exported as rooflight_source_up{source="nvml"} 0.
  Init is retried after `init_retry_s`, then at intervals that double up to `init_retry_max_s`
  (a node without a GPU stays without one; one whose driver loads late is found within minutes),
  each failed try logged with the time of the next. Between tries a sample fails at once, on the
  event loop, without a trip to the NVML thread.
- One reading NOT_SUPPORTED / FUNCTION_NOT_FOUND / NO_PERMISSION removes that reading only; it is
  remembered per device and never asked again (`unsupported` says which and why). Other errors
  leave the reading out of this sample and are retried next time.
- GPU_IS_LOST marks that device lost (extra["up"] = 0, nothing else); it is never polled again.
- All NVML calls run on one daemon thread. A sample that does not finish within `call_timeout`
  raises SourceError("timeout", ...). The stuck call keeps its thread (Python cannot interrupt a
  C call), so until it returns the collector is *degraded*: further samples fail at once with
  "timeout" instead of queueing behind it, so threads never pile up, and because the thread is a
  daemon a wedged driver cannot block the agent's exit. When the call returns, sampling resumes.

Readings beyond GpuDevice's own fields go into `extra` under the keys of GPU_EXTRA_METRICS (each
exported as `rooflight_gpu_<key>`), in base units. GPM readings (Hopper+) need two samples more
than 100 ms apart; the collector keeps two buffers per device and alternates them, so the first
sample (and any sample sooner than 100 ms after the last) carries no GPM readings.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from rooflight.collectors.daemon_executor import DaemonThreadExecutor
from rooflight.collectors.errors import SourceError
from rooflight.collectors.samples import GpuDevice, GpuSample

GPU_EXTRA_METRICS: Mapping[str, tuple[str, str]] = {
    "up": ("gauge", "1 if NVML answered for this GPU, 0 once it is lost (NVML_ERROR_GPU_IS_LOST)"),
    "memory_free_bytes": ("gauge", "Free device memory (NVML v2 memory info)"),
    "memory_busy_ratio": ("gauge", "Share of time device memory was read or written (NVML utilization.memory); a duty cycle, not bandwidth"),
    "graphics_engine_active_ratio": ("gauge", "Share of time the graphics/compute engine was active (GPM)"),
    "sm_active_ratio": ("gauge", "Share of SMs that were busy (GPM SM_UTIL)"),
    "sm_occupancy_ratio": ("gauge", "Resident warps over the theoretical maximum (GPM SM_OCCUPANCY)"),
    "tensor_active_ratio": ("gauge", "Share of time SMs ran any tensor-core op (GPM ANY_TENSOR_UTIL)"),
    "pcie_tx_bytes_per_second": ("gauge", "PCIe bytes per second sent by the GPU"),
    "pcie_rx_bytes_per_second": ("gauge", "PCIe bytes per second received by the GPU"),
    "nvlink_tx_bytes_per_second": ("gauge", "NVLink bytes per second sent, all links (GPM)"),
    "nvlink_rx_bytes_per_second": ("gauge", "NVLink bytes per second received, all links (GPM)"),
    "gpm_window_seconds": ("gauge", "Length of the window the GPM readings cover"),
    "clock_sm_hertz": ("gauge", "Current SM clock"),
    "clock_memory_hertz": ("gauge", "Current memory clock"),
    "clock_event_reasons": ("gauge", "Bitmask of current clock event (throttle) reasons, NVML nvmlClocksEventReason* bits"),
    "power_watts": ("gauge", "Power draw (1 s average on Ampere-non-GA100 and newer)"),
    "power_limit_watts": ("gauge", "Enforced power limit"),
    "energy_joules_total": ("counter", "Energy used since the driver loaded"),
    "temperature_celsius": ("gauge", "GPU core temperature"),
    "ecc_corrected_errors_total": ("counter", "Corrected ECC errors since the driver loaded (volatile)"),
    "ecc_uncorrected_errors_total": ("counter", "Uncorrected ECC errors since the driver loaded (volatile)"),
    "remapped_rows_correctable": ("gauge", "Rows remapped for correctable errors"),
    "remapped_rows_uncorrectable": ("gauge", "Rows remapped for uncorrectable errors"),
    "remapped_rows_pending": ("gauge", "1 if a remap is pending (needs a GPU reset)"),
    "remapped_rows_failure": ("gauge", "1 if a row remap failed"),
    "xid_errors_total": ("counter", "XID critical-error events seen since the agent started"),
    "xid_last_code": ("gauge", "The last XID code seen"),
}

log = logging.getLogger("rooflight")

INIT_RETRY_S = 60.0  # the first retry of a failed init
INIT_RETRY_MAX_S = 300.0  # the longest wait between retries
GPM_MIN_INTERVAL_S = 0.1  # NVML: the two GPM samples must be more than 100 ms apart
MIB = 1024 * 1024
_CACHE_CODES = {3: "not_supported", 13: "function_not_found", 4: "no_permission"}  # NVML return codes
_GPU_IS_LOST = 15
_LIBRARY_NOT_FOUND = 12  # NVML_ERROR_LIBRARY_NOT_FOUND: no libnvidia-ml.so on this machine


class _GpuLost(Exception):
    pass


@dataclass
class _Device:
    handle: Any
    index: int
    uuid: str
    name: str
    parent: Any = None  # parent handle for a MIG device
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    lost: bool = False
    unsupported: dict[str, str] = field(default_factory=dict)
    gpm_bufs: list[Any] = field(default_factory=list)
    gpm_prev_t: float | None = None
    event_set: Any = None
    xid_total: int = 0
    xid_last: int | None = None


_GPM_IDS: dict[str, tuple[str, float]] = {  # key -> (pynvml constant, scale to base units)
    "dram_bandwidth_utilization_ratio": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "graphics_engine_active_ratio": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    "sm_active_ratio": ("NVML_GPM_METRIC_SM_UTIL", 0.01),
    "sm_occupancy_ratio": ("NVML_GPM_METRIC_SM_OCCUPANCY", 0.01),
    "tensor_active_ratio": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "pcie_tx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    "pcie_rx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    "nvlink_tx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    "nvlink_rx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
}


class GpuSource(Protocol):
    """What the sampler reads GPUs through: NvmlCollector, or a test's stand-in."""

    # The processes on each GPU at the last sample: uuid -> ((pid, used bytes or None), ...).
    processes: Mapping[str, tuple[tuple[int, int | None], ...]]

    async def sample(self) -> GpuSample: ...  # raises SourceError when NVML cannot answer

    def close(self) -> None: ...


class NvmlCollector:
    """Samples every visible GPU. `lib` is the pynvml module (default) or a FakeNvml with the same function names."""

    def __init__(self, lib: Any | None = None, *, call_timeout: float = 2.0, executor: Executor | None = None,
                 clock: Callable[[], float] = time.time, init_retry_s: float = INIT_RETRY_S,
                 init_retry_max_s: float = INIT_RETRY_MAX_S) -> None:
        self._lib = lib
        self._call_timeout = call_timeout
        self._own_executor = executor is None
        self._executor: Executor = executor or DaemonThreadExecutor()
        self._clock = clock
        self._init_retry_s = init_retry_s
        self._init_retry_max_s = max(init_retry_max_s, init_retry_s)
        self._devices: list[_Device] | None = None
        self._driver_version: str | None = None
        self._init_failed_at: float | None = None
        self._init_failures = 0  # failed inits in a row
        self._init_wait = init_retry_s  # from the last failure to the next try
        self._init_error = ""
        self._pending: Future[Any] | None = None
        self._stuck_since: float | None = None
        self._closed = False
        self.processes: Mapping[str, tuple[tuple[int, int | None], ...]] = {}  # uuid -> ((pid, used bytes), ...)
        self.absent = False  # NVML's library is not on this machine: no GPU hardware to read

    # -- async surface ---------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """True while an earlier NVML call is still stuck on the worker thread."""
        return self._pending is not None and not self._pending.done()

    @property
    def unsupported(self) -> Mapping[tuple[int, str, str], str]:
        """(index, uuid, reading) -> reason, for every reading NVML refused on a device."""
        return {(d.index, d.uuid, k): r for d in self._devices or [] for k, r in d.unsupported.items()}

    async def sample(self) -> GpuSample:
        if self._closed:
            raise SourceError("nvml", "collector closed")
        if self.degraded:
            stuck = self._clock() - (self._stuck_since or self._clock())
            raise SourceError("timeout", f"an NVML call has been stuck for {stuck:.1f} s; not queueing another")
        if self._init_waiting(self._clock()):
            raise SourceError("nvml", self._init_error)
        fut = self._executor.submit(self._sample_sync)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even if abandoned
        self._pending = fut
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), self._call_timeout)
        except asyncio.TimeoutError:
            self._stuck_since = self._clock()
            raise SourceError("timeout", f"NVML did not answer within {self._call_timeout} s") from None

    def close(self) -> None:
        """Frees GPM buffers and event sets and shuts NVML down, unless a call is stuck (then it just leaves)."""
        if self._closed:
            return
        self._closed = True
        if not self.degraded and self._devices is not None:
            try:
                self._executor.submit(self._shutdown_sync).result(timeout=self._call_timeout)
            except Exception:  # best effort on the way out
                pass
        if self._own_executor:
            self._executor.shutdown(wait=False)

    # -- worker thread ---------------------------------------------------------------------
    def _sample_sync(self) -> GpuSample:
        t0 = self._clock()
        devices = self._ensure_init()
        out: list[GpuDevice] = []
        procs: dict[str, tuple[tuple[int, int | None], ...]] = {}
        for dev in devices:
            out.append(self._read_device(dev, procs))
        self.processes = procs
        return GpuSample(timestamp=t0, duration=self._clock() - t0, devices=tuple(out),
                         driver_version=self._driver_version)

    def _init_waiting(self, now: float) -> bool:
        """True while NVML is down and its next init try is not due yet."""
        failed_at = self._init_failed_at
        return self._devices is None and failed_at is not None and now - failed_at < self._init_wait

    def _ensure_init(self) -> list[_Device]:
        if self._devices is not None:
            return self._devices
        now = self._clock()
        if self._init_waiting(now):
            raise SourceError("nvml", self._init_error)
        try:
            if self._lib is None:
                import pynvml  # a missing package is the same state as a missing library
                self._lib = pynvml
            self._lib.nvmlInit()
            self._devices = self._enumerate()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
            # No NVML library at all (no NVIDIA driver installed, or a container without the NVIDIA runtime's
            # mount): no GPU to read here, not a GPU down. A driver that will not load is a fault.
            self.absent = isinstance(exc, ImportError) or getattr(exc, "value", None) == _LIBRARY_NOT_FOUND
            self._init_failed(now, f"NVML unavailable: {type(exc).__name__}: {exc}")
            raise SourceError("nvml", self._init_error) from exc
        self.absent = False
        if self._init_failures:
            log.info("NVML available after %d failed init tries", self._init_failures)
        self._init_failures, self._init_wait = 0, self._init_retry_s
        return self._devices

    def _init_failed(self, now: float, error: str) -> None:
        """Remember a failed init and when to try again: each wait twice the last, up to init_retry_max_s."""
        if self._init_failures:
            self._init_wait = min(2 * self._init_wait, self._init_retry_max_s)
        self._init_failures += 1
        self._init_failed_at, self._init_error = now, error
        log.info("%s (try %d); GPU readings are off, next try in %.0f s", error, self._init_failures, self._init_wait)

    def _enumerate(self) -> list[_Device]:
        lib = self._lib
        try:
            self._driver_version = str(lib.nvmlSystemGetDriverVersion())
        except lib.NVMLError:
            self._driver_version = None
        devices: list[_Device] = []
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            dev = _Device(h, i, str(lib.nvmlDeviceGetUUID(h)), str(lib.nvmlDeviceGetName(h)))
            devices.append(dev)
            devices.extend(self._mig_children(dev))
        for dev in devices:
            self._setup_events(dev)
        return devices

    def _mig_children(self, dev: _Device) -> list[_Device]:
        lib = self._lib
        try:
            if lib.nvmlDeviceGetMigMode(dev.handle)[0] != lib.NVML_DEVICE_MIG_ENABLE:
                return []
            count = lib.nvmlDeviceGetMaxMigDeviceCount(dev.handle)
        except lib.NVMLError:
            return []
        children = []
        for j in range(count):
            try:
                mh = lib.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, j)
            except lib.NVMLError:  # NOT_FOUND: empty slot
                continue
            children.append(_Device(mh, dev.index, str(lib.nvmlDeviceGetUUID(mh)), str(lib.nvmlDeviceGetName(mh)),
                                    parent=dev.handle, parent_uuid=dev.uuid,
                                    gpu_instance_id=int(lib.nvmlDeviceGetGpuInstanceId(mh))))
        return children

    def _setup_events(self, dev: _Device) -> None:
        if dev.parent is not None:
            return  # XIDs belong to the physical GPU
        lib = self._lib
        try:
            es = lib.nvmlEventSetCreate()
            try:
                lib.nvmlDeviceRegisterEvents(dev.handle, lib.nvmlEventTypeXidCriticalError, es)
            except lib.NVMLError:
                lib.nvmlEventSetFree(es)
                raise
            dev.event_set = es
        except lib.NVMLError as exc:
            dev.unsupported["xid"] = _CACHE_CODES.get(getattr(exc, "value", -1), "error")

    def _call(self, dev: _Device, key: str, fn: Callable[[], Any]) -> Any:
        """One reading: None if unsupported (remembered) or failed this time; raises _GpuLost."""
        if key in dev.unsupported:
            return None
        try:
            return fn()
        except self._lib.NVMLError as exc:
            code = getattr(exc, "value", -1)
            if code == _GPU_IS_LOST:
                raise _GpuLost() from exc
            if code in _CACHE_CODES:
                dev.unsupported[key] = _CACHE_CODES[code]
            return None

    def _read_device(self, dev: _Device, procs: dict[str, tuple[tuple[int, int | None], ...]]) -> GpuDevice:
        info = {"mig": "true", "parent_uuid": dev.parent_uuid or "",
                "gpu_instance_id": str(dev.gpu_instance_id)} if dev.parent is not None else {}
        if not dev.lost:
            try:
                return self._read_live(dev, info, procs)
            except _GpuLost:
                dev.lost = True
        return GpuDevice(index=dev.index, uuid=dev.uuid, name=dev.name, extra={"up": 0.0}, info=info)

    def _read_live(self, dev: _Device, info: dict[str, str],
                   procs: dict[str, tuple[tuple[int, int | None], ...]]) -> GpuDevice:
        lib, h, c = self._lib, dev.handle, self._call
        extra: dict[str, float] = {"up": 1.0}
        mem = c(dev, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(h, version=lib.nvmlMemory_v2))
        util = c(dev, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(h))
        if mem is not None:
            extra["memory_free_bytes"] = float(mem.free)
        if util is not None:
            extra["memory_busy_ratio"] = util.memory / 100.0
        p = c(dev, "processes", lambda: lib.nvmlDeviceGetComputeRunningProcesses(h))
        if p is not None:
            procs[dev.uuid] = tuple((int(x.pid), x.usedGpuMemory) for x in p)
        gpm = self._read_gpm(dev)
        extra.update({k: v for k, v in gpm.items() if k != "dram_bandwidth_utilization_ratio"})
        if dev.parent is None:
            extra.update(self._read_physical(dev, have_pcie=bool(dev.gpm_bufs)))
        return GpuDevice(
            index=dev.index, uuid=dev.uuid, name=dev.name,
            memory_used_bytes=float(mem.used) if mem is not None else None,
            memory_total_bytes=float(mem.total) if mem is not None else None,
            memory_reserved_bytes=float(mem.reserved) if mem is not None else None,
            kernel_residency_ratio=util.gpu / 100.0 if util is not None else None,
            dram_bandwidth_utilization_ratio=gpm.get("dram_bandwidth_utilization_ratio"),
            extra=extra, info=info,
        )

    def _read_physical(self, dev: _Device, have_pcie: bool) -> dict[str, float]:
        """Readings that only exist for a whole GPU: clocks, power, thermals, ECC, XIDs, legacy PCIe."""
        lib, h, c = self._lib, dev.handle, self._call
        scalar: dict[str, tuple[Callable[[], Any], float]] = {
            "clock_sm_hertz": (lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM), 1e6),
            "clock_memory_hertz": (lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM), 1e6),
            "clock_event_reasons": (lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h), 1.0),
            "power_watts": (lambda: lib.nvmlDeviceGetPowerUsage(h), 1e-3),
            "power_limit_watts": (lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h), 1e-3),
            "energy_joules_total": (lambda: lib.nvmlDeviceGetTotalEnergyConsumption(h), 1e-3),
            "temperature_celsius": (lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU), 1.0),
            "ecc_corrected_errors_total": (lambda: lib.nvmlDeviceGetTotalEccErrors(
                h, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_VOLATILE_ECC), 1.0),
            "ecc_uncorrected_errors_total": (lambda: lib.nvmlDeviceGetTotalEccErrors(
                h, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC), 1.0),
        }
        if not have_pcie:  # no GPM: the 20 ms byte-counter window NVML offers, in KB/s
            scalar["pcie_tx_bytes_per_second"] = (lambda: lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_TX_BYTES), 1024.0)
            scalar["pcie_rx_bytes_per_second"] = (lambda: lib.nvmlDeviceGetPcieThroughput(h, lib.NVML_PCIE_UTIL_RX_BYTES), 1024.0)
        out: dict[str, float] = {}
        for key, (fn, scale) in scalar.items():
            value = c(dev, key, fn)
            if value is not None:
                out[key] = float(value) * scale
        rows = c(dev, "remapped_rows", lambda: lib.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            for key, value in zip(("correctable", "uncorrectable", "pending", "failure"), rows):
                out[f"remapped_rows_{key}"] = float(value)
        self._drain_xids(dev)
        if dev.event_set is not None:
            out["xid_errors_total"] = float(dev.xid_total)
            if dev.xid_last is not None:
                out["xid_last_code"] = float(dev.xid_last)
        return out

    def _drain_xids(self, dev: _Device, limit: int = 64) -> None:
        lib = self._lib
        for _ in range(limit if dev.event_set is not None else 0):
            try:
                data = lib.nvmlEventSetWait(dev.event_set, 0)
            except lib.NVMLError as exc:
                if getattr(exc, "value", -1) == _GPU_IS_LOST:
                    raise _GpuLost() from exc
                return  # NVML_ERROR_TIMEOUT: nothing pending
            if data.eventType & lib.nvmlEventTypeXidCriticalError:
                dev.xid_total += 1
                dev.xid_last = int(data.eventData)

    def _read_gpm(self, dev: _Device) -> dict[str, float]:
        """GPM over [previous sample, now], ping-ponging two buffers; {} when unsupported or no window yet."""
        lib, c = self._lib, self._call
        if not dev.gpm_bufs:
            support = c(dev, "gpm", lambda: lib.nvmlGpmQueryDeviceSupport(dev.parent or dev.handle))
            if support is None:
                return {}
            if not support.isSupportedDevice:
                dev.unsupported["gpm"] = "not_supported"
                return {}
            bufs = c(dev, "gpm", lambda: [lib.nvmlGpmSampleAlloc(), lib.nvmlGpmSampleAlloc()])
            if bufs is None:
                return {}
            dev.gpm_bufs = bufs
        now = self._clock()
        if dev.gpm_prev_t is not None and now - dev.gpm_prev_t <= GPM_MIN_INTERVAL_S:
            return {}  # too soon: keep the baseline, report no window
        cur = dev.gpm_bufs[1] if dev.gpm_prev_t is not None else dev.gpm_bufs[0]
        if dev.parent is None:
            took = c(dev, "gpm", lambda: lib.nvmlGpmSampleGet(dev.handle, cur))
        else:
            took = c(dev, "gpm", lambda: lib.nvmlGpmMigSampleGet(dev.parent, dev.gpu_instance_id, cur))
        if took is None:
            dev.gpm_prev_t = None  # start a fresh window next time
            return {}
        if dev.gpm_prev_t is None:
            dev.gpm_prev_t = now
            return {}
        req = lib.c_nvmlGpmMetricsGet_t()
        req.version = lib.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(_GPM_IDS)
        req.sample1, req.sample2 = dev.gpm_bufs[0], dev.gpm_bufs[1]
        for i, (const, _) in enumerate(_GPM_IDS.values()):
            req.metrics[i].metricId = getattr(lib, const)
        window = now - dev.gpm_prev_t
        dev.gpm_bufs.reverse()  # the newest sample is the next baseline
        dev.gpm_prev_t = now
        if c(dev, "gpm_metrics", lambda: lib.nvmlGpmMetricsGet(req)) is None:
            return {}
        out = {"gpm_window_seconds": window}
        for i, (key, (_, scale)) in enumerate(_GPM_IDS.items()):
            m = req.metrics[i]
            if m.nvmlReturn == lib.NVML_SUCCESS and math.isfinite(m.value):
                out[key] = float(m.value) * scale
        return out

    def _shutdown_sync(self) -> None:
        lib = self._lib
        for dev in self._devices or []:
            for buf in dev.gpm_bufs:
                self._quiet(lambda b=buf: lib.nvmlGpmSampleFree(b))
            if dev.event_set is not None:
                self._quiet(lambda es=dev.event_set: lib.nvmlEventSetFree(es))
        self._quiet(lib.nvmlShutdown)

    def _quiet(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
        except self._lib.NVMLError:
            pass
