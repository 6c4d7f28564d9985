"""NvmlCollector faults: missing library, no driver, permission, lost GPU, a hung call, real pynvml here."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import pynvml

from rooflight.collectors.daemon_executor import DaemonThreadExecutor
from rooflight.collectors.errors import SourceError
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import FakeNvml, h100_like


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_NO_PERMISSION, pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH])
async def test_init_failure_is_a_source_error_not_a_crash(code: int) -> None:
    fake = FakeNvml([], init_error=code)
    c = NvmlCollector(fake, clock=Clock())
    with pytest.raises(SourceError) as err:
        await c.sample()
    assert err.value.reason == "nvml"
    assert str(pynvml.NVMLError(code)) in str(err.value)
    c.close()


async def test_init_is_retried_only_after_the_retry_interval() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    fake.gpus.extend(h100_like().gpus)
    clock = Clock()
    c = NvmlCollector(fake, clock=clock, init_retry_s=60)
    for _ in range(3):
        with pytest.raises(SourceError):
            await c.sample()
        clock.t += 10
    assert fake.calls["nvmlInit"] == 1
    fake.init_error = None  # the driver got loaded
    clock.t += 60
    s = await c.sample()
    assert fake.calls["nvmlInit"] == 2
    assert s.devices[0].uuid == "GPU-h100-0000"


async def test_real_pynvml_without_a_gpu_reports_library_not_found() -> None:
    c = NvmlCollector(call_timeout=5.0)  # the real module: no libnvidia-ml.so.1 on this machine
    with pytest.raises(SourceError) as err:
        await c.sample()
    assert err.value.reason == "nvml"
    assert "LibraryNotFound" in str(err.value) or "DriverNotLoaded" in str(err.value)
    c.close()


async def test_enumeration_failure_is_a_source_error() -> None:
    fake = h100_like()
    fake.fail_call("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(SourceError) as err:
        await NvmlCollector(fake, clock=Clock()).sample()
    assert err.value.reason == "nvml"


async def test_gpu_lost_marks_that_device_down_and_stops_polling_it() -> None:
    fake = h100_like(2)
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    await c.sample()
    fake.gpu_lost(1)
    clock.t += 1
    s = await c.sample()
    ok, lost = s.devices
    assert ok.extra["up"] == 1.0 and ok.memory_used_bytes is not None
    assert lost.uuid == "GPU-h100-0001" and lost.extra == {"up": 0.0}
    assert lost.memory_used_bytes is None and lost.kernel_residency_ratio is None
    calls = sum(fake.calls.values())
    clock.t += 1
    s = await c.sample()
    assert s.devices[1].extra == {"up": 0.0}
    per_sample = sum(fake.calls.values()) - calls
    clock.t += 1
    await c.sample()
    assert sum(fake.calls.values()) - calls == 2 * per_sample  # the lost GPU costs no calls


async def test_gpu_lost_seen_first_by_the_xid_poll() -> None:
    fake = h100_like()
    c = NvmlCollector(fake, clock=Clock())
    await c.sample()
    fake.gpu_lost(0)
    assert (await c.sample()).devices[0].extra == {"up": 0.0}


async def test_permission_denied_on_one_reading_is_remembered() -> None:
    fake = h100_like()
    fake.fail_call("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NO_PERMISSION)
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    for _ in range(2):
        d = (await c.sample()).devices[0]
        clock.t += 1
    assert d.memory_used_bytes is None and d.memory_total_bytes is None
    assert d.extra["power_watts"] == 550.0
    assert c.unsupported[(0, "GPU-h100-0000", "memory")] == "no_permission"
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 1


async def test_transient_error_is_retried_next_sample() -> None:
    fake = h100_like()
    fake.fail_call("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    c = NvmlCollector(fake, clock=Clock())
    assert "power_watts" not in (await c.sample()).devices[0].extra
    fake.clear_failures()
    assert (await c.sample()).devices[0].extra["power_watts"] == 550.0


async def test_function_missing_on_an_old_driver() -> None:
    fake = h100_like()
    fake.fail_call("nvmlGpmQueryDeviceSupport", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    await c.sample()
    clock.t += 1
    d = (await c.sample()).devices[0]
    assert d.dram_bandwidth_utilization_ratio is None
    assert d.extra["pcie_tx_bytes_per_second"] == 2 * 1024 * 1024  # legacy call takes over
    assert c.unsupported[(0, "GPU-h100-0000", "gpm")] == "function_not_found"


async def test_hung_call_returns_in_bounded_time_and_does_not_pile_up() -> None:
    fake = h100_like()
    c = NvmlCollector(fake, call_timeout=1.0, clock=Clock())
    await c.sample()
    fake.hang_call("nvmlDeviceGetPowerUsage", 30.0)
    t0 = time.monotonic()
    with pytest.raises(SourceError) as err:
        await c.sample()
    assert err.value.reason == "timeout"
    assert time.monotonic() - t0 < 3.0  # the call timeout (1 s), not the 30 s hang
    assert c.degraded
    t0 = time.monotonic()
    with pytest.raises(SourceError) as err:
        await c.sample()  # refused at once: nothing queued behind the stuck call (which would wait 1 s)
    assert err.value.reason == "timeout" and time.monotonic() - t0 < 0.5
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2
    fake.release()
    for _ in range(50):
        if not c.degraded:
            break
        await asyncio.sleep(0.02)
    assert not c.degraded
    s = await c.sample()
    assert s.devices[0].extra["power_watts"] == 550.0
    c.close()


async def test_event_loop_keeps_running_during_a_hang() -> None:
    fake = h100_like()
    fake.hang_call("nvmlInit", 30.0)
    c = NvmlCollector(fake, call_timeout=0.6, clock=Clock())  # ~60 ticks of 10 ms while it waits; a blocked loop: 0
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    with pytest.raises(SourceError):
        await c.sample()
    task.cancel()
    assert ticks >= 10
    fake.release()
    c.close()


async def test_close_frees_gpm_buffers_and_event_sets() -> None:
    fake = h100_like()
    c = NvmlCollector(fake, clock=Clock())
    await c.sample()
    c.close()
    assert fake.calls["nvmlGpmSampleFree"] == 2
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.calls["nvmlShutdown"] == 1
    with pytest.raises(SourceError):
        await c.sample()


class CountingExecutor(DaemonThreadExecutor):
    """The collector's own executor, counting the jobs handed to its thread."""

    def __init__(self) -> None:
        super().__init__(name="test-nvml")
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def test_init_retries_wait_twice_as_long_each_time_up_to_the_max() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    clock = Clock(0.0)
    c = NvmlCollector(fake, clock=clock, init_retry_s=60, init_retry_max_s=300)
    tries: list[float] = []
    for _ in range(1500):  # one sample a second, as the agent's NVML loop, for 25 minutes
        before = fake.calls["nvmlInit"]
        with pytest.raises(SourceError) as err:
            await c.sample()
        assert err.value.reason == "nvml" and "LibraryNotFound" in str(err.value)
        if fake.calls["nvmlInit"] > before:
            tries.append(clock.t)
        clock.t += 1
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps == [min(60 * 2**i, 300) for i in range(len(gaps))]
    assert gaps[-1] == 300 and len(gaps) >= 5  # reached the cap and stayed there
    c.close()


async def test_samples_between_init_tries_do_not_use_the_nvml_thread() -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    clock = Clock()
    executor = CountingExecutor()
    c = NvmlCollector(fake, clock=clock, executor=executor, init_retry_s=60)
    for _ in range(30):
        with pytest.raises(SourceError) as err:
            await c.sample()
        assert err.value.reason == "nvml" and "DriverNotLoaded" in str(err.value)
        clock.t += 1
    assert executor.submitted == 1 and fake.calls["nvmlInit"] == 1
    clock.t += 60
    with pytest.raises(SourceError):
        await c.sample()
    assert executor.submitted == 2 and fake.calls["nvmlInit"] == 2
    executor.shutdown()


async def test_each_failed_init_is_logged_with_the_next_try_and_recovery_too(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    fake.gpus.extend(h100_like().gpus)
    clock = Clock()
    c = NvmlCollector(fake, clock=clock, init_retry_s=10, init_retry_max_s=40)
    caplog.set_level(logging.INFO, logger="rooflight")
    for wait in (10, 20):
        with pytest.raises(SourceError):
            await c.sample()
        clock.t += wait
    fake.init_error = None  # the driver got loaded
    assert (await c.sample()).devices[0].uuid == "GPU-h100-0000"
    lines = [r.getMessage() for r in caplog.records if r.name == "rooflight"]
    assert "try 1" in lines[0] and "next try in 10 s" in lines[0] and "DriverNotLoaded" in lines[0]
    assert "try 2" in lines[1] and "next try in 20 s" in lines[1]
    assert "NVML available after 2 failed init tries" in lines[2]
    c.close()
