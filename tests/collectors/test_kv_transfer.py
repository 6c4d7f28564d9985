"""KV transfer time and speed: SGLang's `sglang:kv_transfer_*` read into a series' extras by
collectors/sglang.py, and exported per window as rooflight_kv_transfer_latency_seconds and
rooflight_kv_transfer_speed_bytes_per_second (docs/metrics.md, section Capacity, cost and energy)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import SeriesView, Snapshot, TargetView
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.collectors import dynamo, sglang, vllm
from support import GOLDEN, FakeEngine, check_golden, promtool_clean, sample_text, started_agent, synthetic_page

PAGE = synthetic_page("sglang-pd-prefill-kv-transfer")
SCHED = 'engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0"'


def _extra(text: str, adapter: object = sglang) -> dict[str, float]:
    (one,) = adapter.parse(text, target="t", timestamp=1.0, duration=0.0).series  # type: ignore[attr-defined]
    return dict(one.extra)


def _gauges(latency_ms: float, speed_gb_s: float) -> str:
    """The synthetic page with TP rank 0's last-transfer latency and speed set (rank 1 keeps its own)."""
    text = re.sub(r'(sglang:kv_transfer_latency_ms\{[^}]*tp_rank="0"\}) \S+', rf"\g<1> {latency_ms}", PAGE)
    return re.sub(r'(sglang:kv_transfer_speed_gb_s\{[^}]*tp_rank="0"\}) \S+', rf"\g<1> {speed_gb_s}", text)


def _histograms(latency: tuple[float, float], speed: tuple[float, float]) -> str:
    """SGLang 0.5.23's form: latency and speed are histograms; (sum, count) of each, on TP ranks 0 and 1
    (rank 1 with other numbers, which must not be read)."""
    lines = [f"sglang:num_running_reqs{{{SCHED},tp_rank=\"0\"}} 3.0"]
    for base, (total, count) in (("kv_transfer_latency_ms", latency), ("kv_transfer_speed_gb_s", speed)):
        lines.append(f"# TYPE sglang:{base} histogram")
        for rank, scale in (("0", 1.0), ("1", 7.0)):
            lab = f'{SCHED},tp_rank="{rank}"'
            lines += [f'sglang:{base}_bucket{{{lab},le="+Inf"}} {count * scale}',
                      f"sglang:{base}_count{{{lab}}} {count * scale}", f"sglang:{base}_sum{{{lab}}} {total * scale}"]
    return "\n".join(lines) + "\n"


# --- the adapter ---

def test_the_gauges_are_read_from_the_lowest_replica_and_a_zero_is_never_set() -> None:
    extra = _extra(PAGE)
    assert extra["kv_transfer_latency_ms"] == 10.0 and extra["kv_transfer_speed_gb_s"] == 20.0  # tp_rank 0's
    assert extra["kv_transfer_bootstrap_ms"] == 2.0 and extra["kv_transfer_total_mb"] == 200.0
    assert "kv_transfer_alloc_ms" not in extra  # 0.0: never set


def test_a_unified_engine_reports_zeros_which_are_not_read() -> None:
    extra = _extra(sample_text("dynamo-sglang-worker-1req.prom"), dynamo)
    assert not [k for k in extra if k.startswith("kv_transfer")]


def test_the_histogram_form_keeps_sum_and_count_as_counters() -> None:
    extra = _extra(_histograms(latency=(100.0, 4.0), speed=(80.0, 4.0)))
    assert extra["kv_transfer_latency_ms_sum_total"] == 100.0 and extra["kv_transfer_latency_ms_count_total"] == 4.0
    assert extra["kv_transfer_speed_gb_s_sum_total"] == 80.0 and extra["kv_transfer_speed_gb_s_count_total"] == 4.0
    assert "kv_transfer_latency_ms" not in extra  # no gauge on a histogram page


# --- windowed and exported ---

async def _windowed(engine: FakeEngine, pages: list[str]) -> TargetView:
    """The pages sampled 5 s apart, one 10 s window over them."""
    clock = FakeClock()
    settings = {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "1s", "windows": "10s"}
    async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
        for i, page in enumerate(pages):
            if i:
                clock.advance(5.0)
            engine.body = page
            await agent.sample_engines_once()
        (target,) = agent.snapshot.targets
        return target


def _served(target: TargetView) -> dict[str, float]:
    text = generate_latest(registry_for(lambda: Snapshot(created=0.0, targets=(target,)))).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name in (n.KV_TRANSFER_LATENCY, n.KV_TRANSFER_SPEED)}


async def test_the_gauges_time_weighted_mean_in_seconds_and_bytes(fake_engine: FakeEngine) -> None:
    # 10 ms and 20 GB/s held for 5 s, then 30 ms and 40 GB/s for 5 s: 20 ms = 0.02 s, 30 GB/s = 3e10 B/s
    target = await _windowed(fake_engine, [_gauges(10.0, 20.0), _gauges(30.0, 40.0), _gauges(99.0, 99.0)])
    (w,) = target.series[0].windows
    assert w.seconds == 10.0
    assert w.kv_transfer_latency_seconds == pytest.approx(0.02)
    assert w.kv_transfer_speed_bytes_per_second == pytest.approx(3e10)
    assert _served(target) == pytest.approx({n.KV_TRANSFER_LATENCY: 0.02, n.KV_TRANSFER_SPEED: 3e10})
    text = generate_latest(registry_for(lambda: Snapshot(created=0.0, targets=(target,)))).decode()
    text = text.replace(target.name, "ENGINE")  # the fake engine's port changes per run
    promtool_clean(text)
    check_golden(GOLDEN / "sglang-kv-transfer.prom", text)


async def test_the_histograms_mean_per_transfer(fake_engine: FakeEngine) -> None:
    # 3 transfers in the window: latency sum +60 ms -> 20 ms each; speed sum +90 GB/s -> 30 GB/s each
    pages = [_histograms(latency=(100.0, 4.0), speed=(80.0, 4.0)), _histograms(latency=(160.0, 7.0), speed=(170.0, 7.0))]
    target = await _windowed(fake_engine, pages)
    (w,) = target.series[0].windows
    assert w.kv_transfer_latency_seconds == pytest.approx(0.02)
    assert w.kv_transfer_speed_bytes_per_second == pytest.approx(3e10)


async def test_absent_without_transfers(fake_engine: FakeEngine) -> None:
    # the histogram form without a transfer in the window, and a gauge that first appears mid-window
    still = _histograms(latency=(100.0, 4.0), speed=(80.0, 4.0))
    quiet = await _windowed(fake_engine, [still, still])
    late = await _windowed(fake_engine, [_gauges(0.0, 0.0), _gauges(10.0, 20.0), _gauges(10.0, 20.0)])
    for target in (quiet, late):
        (w,) = target.series[0].windows
        assert (w.kv_transfer_latency_seconds, w.kv_transfer_speed_bytes_per_second) == (None, None)
        assert _served(target) == {}


# --- failed transfers (rooflight_kv_transfer_failures_total) ---

VLLM_FAILURES = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 3.0
vllm:nixl_num_failed_transfers_total{engine="1",model_name="m"} 5.0
"""


def _failures(adapter: object, text: str) -> dict[str, float | None]:
    sample = adapter.parse(text, target="t", timestamp=1.0, duration=0.0)  # type: ignore[attr-defined]
    return {s.rank: s.kv_transfer_failures_total for s in sample.series}


def _exported_failures(adapter: object, text: str) -> dict[str, float]:
    sample = adapter.parse(text, target="t", timestamp=1.0, duration=0.0)  # type: ignore[attr-defined]
    target = TargetView(name="t", url="http://t", engine=sample.engine, constants=None, model_source=None,
                        series=tuple(SeriesView(series=s) for s in sample.series))
    served = generate_latest(registry_for(lambda: Snapshot(created=0.0, targets=(target,)))).decode()
    return {s.labels["rank"]: s.value for family in text_string_to_metric_families(served) for s in family.samples
            if s.name == n.KV_TRANSFER_FAILURES}


def test_vllm_nixl_failed_transfers_per_engine_rank_are_exported_as_counted() -> None:
    assert _failures(vllm, VLLM_FAILURES) == {"0": 3.0, "1": 5.0}
    assert _exported_failures(vllm, VLLM_FAILURES) == {"0": 3.0, "1": 5.0}
    sample = vllm.parse(VLLM_FAILURES, target="t", timestamp=1.0, duration=0.0)
    target = TargetView(name="t", url="http://t", engine=sample.engine, constants=None, model_source=None,
                        series=tuple(SeriesView(series=s) for s in sample.series))
    text = generate_latest(registry_for(lambda: Snapshot(created=0.0, targets=(target,)))).decode()
    promtool_clean(text)
    check_golden(GOLDEN / "vllm-kv-transfer-failures.prom", text)


def test_sglang_transfer_failed_requests_are_read_and_absent_where_not_counted() -> None:
    counted = PAGE + f'# TYPE sglang:num_transfer_failed_reqs counter\nsglang:num_transfer_failed_reqs_total{{{SCHED},tp_rank="0"}} 7.0\n'
    assert set(_failures(sglang, counted).values()) == {7.0}
    assert set(_failures(sglang, PAGE).values()) == {None}  # a page without the counter: unknown, not 0
    assert _exported_failures(sglang, PAGE) == {}
    assert list(_exported_failures(sglang, counted).values()) == [7.0]
