"""NvmlCollector against the fake backend: one test per reading, on an H100-like and an A100-like GPU."""

from __future__ import annotations

import pytest
import pynvml

from rooflight.collectors.nvml import GPU_EXTRA_METRICS, NvmlCollector
from rooflight.collectors.nvml_fake import MIB, FakeGpu, FakeMig, FakeNvml, a100_like, h100_like
from rooflight.collectors.samples import GpuDevice


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def two_samples(fake: FakeNvml, gap: float = 1.0) -> tuple[NvmlCollector, GpuDevice, GpuDevice]:
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    first = (await c.sample()).devices[0]
    clock.t += gap
    second = (await c.sample()).devices[0]
    return c, first, second


async def test_identity_and_v2_memory() -> None:
    fake = h100_like(2)
    c = NvmlCollector(fake, clock=Clock())
    s = await c.sample()
    assert [d.index for d in s.devices] == [0, 1]
    assert [d.uuid for d in s.devices] == ["GPU-h100-0000", "GPU-h100-0001"]
    d = s.devices[0]
    assert d.name == "NVIDIA H100 80GB HBM3"
    assert d.memory_total_bytes == 81559 * MIB
    assert d.memory_used_bytes == 60000 * MIB  # v2: reserved not folded into used
    assert d.memory_reserved_bytes == 479 * MIB
    assert d.extra["memory_free_bytes"] == (81559 - 60000 - 479) * MIB
    assert s.driver_version == "590.48.01"
    assert s.timestamp == 1000.0
    c.close()


async def test_kernel_residency_and_memory_duty_cycle() -> None:
    fake = h100_like()
    fake.gpus[0].gpu_util_percent = 42
    fake.gpus[0].mem_util_percent = 7
    c = NvmlCollector(fake, clock=Clock())
    d = (await c.sample()).devices[0]
    assert d.kernel_residency_ratio == pytest.approx(0.42)
    assert d.extra["memory_busy_ratio"] == pytest.approx(0.07)


async def test_gpm_needs_two_samples_then_reports_the_second_window() -> None:
    fake = h100_like()
    c, first, second = await two_samples(fake, gap=1.5)
    assert first.dram_bandwidth_utilization_ratio is None
    assert "sm_active_ratio" not in first.extra
    assert second.dram_bandwidth_utilization_ratio == pytest.approx(0.55)
    assert second.extra["sm_active_ratio"] == pytest.approx(0.80)
    assert second.extra["sm_occupancy_ratio"] == pytest.approx(0.25)
    assert second.extra["tensor_active_ratio"] == pytest.approx(0.30)
    assert second.extra["graphics_engine_active_ratio"] == pytest.approx(0.97)
    assert second.extra["gpm_window_seconds"] == pytest.approx(1.5)
    assert second.extra["pcie_tx_bytes_per_second"] == pytest.approx(2 * MIB)
    assert second.extra["pcie_rx_bytes_per_second"] == pytest.approx(8 * MIB)
    assert second.extra["nvlink_tx_bytes_per_second"] == pytest.approx(1000 * MIB)
    assert second.extra["nvlink_rx_bytes_per_second"] == pytest.approx(1200 * MIB)
    assert fake.calls["nvmlGpmSampleAlloc"] == 2


async def test_gpm_alternates_buffers_and_follows_the_gpu() -> None:
    fake = h100_like()
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    seen = []
    for pct in (10.0, 20.0, 30.0, 40.0):
        fake.gpus[0].dram_bw_util_percent = pct
        seen.append((await c.sample()).devices[0].dram_bandwidth_utilization_ratio)
        clock.t += 1.0
    # The fake refuses sample1 == sample2 or a stale sample1, so this only passes with ping-pong.
    assert seen == [None, pytest.approx(0.2), pytest.approx(0.3), pytest.approx(0.4)]
    assert fake.calls["nvmlGpmSampleAlloc"] == 2
    assert fake.calls["nvmlGpmSampleGet"] == 4


async def test_gpm_sooner_than_100ms_gives_no_window_and_keeps_the_baseline() -> None:
    fake = h100_like()
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    await c.sample()
    clock.t += 0.05
    assert (await c.sample()).devices[0].dram_bandwidth_utilization_ratio is None
    clock.t += 0.10
    d = (await c.sample()).devices[0]
    assert d.extra["gpm_window_seconds"] == pytest.approx(0.15)
    assert d.dram_bandwidth_utilization_ratio == pytest.approx(0.55)


async def test_a100_like_has_no_gpm_but_legacy_pcie() -> None:
    fake = a100_like()
    c, _, d = await two_samples(fake)
    assert d.dram_bandwidth_utilization_ratio is None
    for key in ("sm_active_ratio", "tensor_active_ratio", "nvlink_rx_bytes_per_second", "gpm_window_seconds"):
        assert key not in d.extra
    assert d.extra["pcie_tx_bytes_per_second"] == 4 * 1024 * 1024
    assert d.kernel_residency_ratio == pytest.approx(0.99)
    assert c.unsupported[(0, "GPU-a100-0000", "gpm")] == "not_supported"
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1  # asked once, remembered
    assert fake.calls["nvmlGpmSampleAlloc"] == 0


async def test_clocks_power_thermals_ecc_rows() -> None:
    _, _, d = await two_samples(a100_like())
    e = d.extra
    assert e["clock_sm_hertz"] == 1410e6
    assert e["clock_memory_hertz"] == 1593e6
    assert e["clock_event_reasons"] == float(pynvml.nvmlClocksEventReasonSwPowerCap)
    assert e["power_watts"] == pytest.approx(380.0)
    assert e["power_limit_watts"] == pytest.approx(400.0)
    assert e["energy_joules_total"] == pytest.approx(9876.543)
    assert e["temperature_celsius"] == 55.0
    assert e["ecc_corrected_errors_total"] == 3.0
    assert e["ecc_uncorrected_errors_total"] == 0.0
    assert (e["remapped_rows_correctable"], e["remapped_rows_pending"]) == (1.0, 0.0)
    assert e["up"] == 1.0


async def test_xid_events_are_counted_and_the_last_code_kept() -> None:
    fake = h100_like()
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    assert (await c.sample()).devices[0].extra["xid_errors_total"] == 0.0
    fake.gpus[0].xid_events.extend([79, 48])
    d = (await c.sample()).devices[0]
    assert d.extra["xid_errors_total"] == 2.0
    assert d.extra["xid_last_code"] == 48.0
    assert (await c.sample()).devices[0].extra["xid_errors_total"] == 2.0


async def test_xid_unsupported_exports_no_xid_series() -> None:
    fake = a100_like()
    fake.gpus[0].xid_supported = False
    c = NvmlCollector(fake, clock=Clock())
    d = (await c.sample()).devices[0]
    assert "xid_errors_total" not in d.extra
    assert c.unsupported[(0, "GPU-a100-0000", "xid")] == "not_supported"


@pytest.mark.parametrize("field_name,key", [
    ("clock_sm_mhz", "clock_sm_hertz"), ("clock_mem_mhz", "clock_memory_hertz"),
    ("clock_event_reasons", "clock_event_reasons"), ("power_mw", "power_watts"),
    ("power_limit_mw", "power_limit_watts"), ("energy_mj", "energy_joules_total"),
    ("temperature_c", "temperature_celsius"), ("ecc_corrected", "ecc_corrected_errors_total"),
    ("ecc_uncorrected", "ecc_uncorrected_errors_total"), ("remapped_rows", "remapped_rows_pending"),
    ("mem_util_percent", "memory_busy_ratio"),
    ("sm_util_percent", "sm_active_ratio"), ("sm_occupancy_percent", "sm_occupancy_ratio"),
    ("tensor_util_percent", "tensor_active_ratio"), ("nvlink_tx_bytes_per_second", "nvlink_tx_bytes_per_second"),
    ("pcie_rx_bytes_per_second", "pcie_rx_bytes_per_second"),
])
async def test_not_supported_removes_only_that_reading(field_name: str, key: str) -> None:
    fake = h100_like()
    setattr(fake.gpus[0], field_name, None)
    _, _, d = await two_samples(fake)
    assert key not in d.extra
    assert d.memory_used_bytes is not None and d.extra["temperature_celsius" if key != "temperature_celsius" else "power_watts"]


async def test_not_supported_dram_and_utilization_leave_fields_none() -> None:
    fake = h100_like()
    fake.gpus[0].dram_bw_util_percent = None
    fake.gpus[0].gpu_util_percent = None
    _, _, d = await two_samples(fake)
    assert d.dram_bandwidth_utilization_ratio is None
    assert d.kernel_residency_ratio is None
    assert d.extra["sm_active_ratio"] == pytest.approx(0.8)


async def test_unsupported_call_is_not_repeated() -> None:
    fake = h100_like()
    fake.gpus[0].temperature_c = None
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    for _ in range(3):
        await c.sample()
        clock.t += 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 1
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3


async def test_running_processes_per_uuid() -> None:
    fake = h100_like(2)
    fake.gpus[1].processes = [(7, 100), (8, 200)]
    c = NvmlCollector(fake, clock=Clock())
    await c.sample()
    assert c.processes == {"GPU-h100-0000": ((4242, 59000 * MIB),), "GPU-h100-0001": ((7, 100), (8, 200))}


async def test_mig_devices_with_gpm_per_gpu_instance() -> None:
    gpu = FakeGpu(uuid="GPU-parent", gpm=True, dram_bw_util_percent=50.0, power_mw=300_000, mig=[
        FakeMig(uuid="MIG-a", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=1,
                memory_total=40 * 1024 * MIB, memory_used=10 * MIB, dram_bw_util_percent=30.0, processes=[(11, 5)]),
        FakeMig(uuid="MIG-b", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gpu_instance_id=2,
                memory_total=40 * 1024 * MIB, memory_used=20 * MIB, dram_bw_util_percent=None),
    ])
    fake = FakeNvml([gpu])
    clock = Clock()
    c = NvmlCollector(fake, clock=clock)
    await c.sample()
    clock.t += 1
    parent, mig_a, mig_b = (await c.sample()).devices
    assert parent.uuid == "GPU-parent" and parent.kernel_residency_ratio is None  # not supported under MIG
    assert parent.extra["power_watts"] == 300.0
    assert mig_a.info == {"mig": "true", "parent_uuid": "GPU-parent", "gpu_instance_id": "1"}
    assert mig_a.index == 0 and mig_a.memory_used_bytes == 10 * MIB
    assert mig_a.dram_bandwidth_utilization_ratio == pytest.approx(0.30)
    assert mig_b.dram_bandwidth_utilization_ratio is None
    assert "power_watts" not in mig_a.extra
    assert fake.calls["nvmlGpmMigSampleGet"] == 4
    assert c.processes["MIG-a"] == ((11, 5),)


def test_extra_metric_table_follows_the_conventions() -> None:
    for key, (kind, help_text) in GPU_EXTRA_METRICS.items():
        assert kind in ("gauge", "counter") and help_text
        assert (kind == "counter") == key.endswith("_total"), key
        assert key == key.lower() and " " not in key


async def test_every_extra_key_emitted_is_documented() -> None:
    fake = h100_like()
    fake.gpus[0].xid_events.append(31)
    _, _, d = await two_samples(fake)
    _, _, a = await two_samples(a100_like())
    assert set(d.extra) | set(a.extra) <= set(GPU_EXTRA_METRICS)
    assert len(set(d.extra)) >= 25
