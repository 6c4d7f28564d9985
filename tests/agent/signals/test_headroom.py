"""Headroom, saturation, capacity, cost and energy: the worked numbers of docs/physics.md (section Headroom),
and exact values on a scripted engine whose state is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import TargetView
from rooflight.agent.roofline import physics
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.sampling.config import build
from rooflight.agent.signals import headroom as hr
from rooflight.agent.signals.derive import WindowValues
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import h100_like
from support import FakeEngine, started_agent

W, KV_TOKEN, P = 16e9, 131_072, 8e9  # the reference 8B: BF16 weights, K+V bytes per token, parameters
H100 = get_profile("h100-sxm")
F, BW = H100.peak_flops["bf16"], H100.memory_bandwidth_bytes_per_second
REF = TargetConstants(model=preset("ref-8b"), gpu=H100, gpu_source="flag")


def _window(**kw: object) -> WindowValues:
    return WindowValues(window="10s", seconds=10.0, **kw)  # type: ignore[arg-type]


# --- the physics (docs/physics.md, section Headroom) ---

def test_decode_bandwidth_headroom_is_the_weights_share_of_the_step() -> None:
    # batch 64 of 600-token sequences: 16 / (16 + 64 x 0.0786) GB = 0.76; 760 of them: 0.21
    assert round(physics.decode_bandwidth_headroom(64, W, 600 * KV_TOKEN, P, F, BW), 2) == 0.76
    assert round(physics.decode_bandwidth_headroom(760, W, 600 * KV_TOKEN, P, F, BW), 2) == 0.21
    # ... which is the weights-only step over the step now
    step = physics.decode_step_seconds(W, 64 * 600 * KV_TOKEN, BW)
    assert physics.decode_bandwidth_headroom(64, W, 600 * KV_TOKEN, P, F, BW) == pytest.approx(W / BW / step)


def test_without_a_cache_it_is_the_batch_left_before_the_ridge() -> None:
    ridge_batch = W * F / (2 * P * BW)  # 295: the step turns compute-bound past it
    assert round(ridge_batch) == 295
    assert round(physics.decode_bandwidth_headroom(64, W, 0.0, P, F, BW), 2) == 0.78
    assert physics.decode_bandwidth_headroom(64, W, 0.0, P, F, BW) == pytest.approx(1 - 64 / ridge_batch)
    assert physics.decode_bandwidth_headroom(400, W, 0.0, P, F, BW) == 0.0  # past the ridge: at the wall
    assert physics.decode_bandwidth_headroom(0, W, 600 * KV_TOKEN, P, F, BW) == 1.0  # idle


def test_ceiling_is_the_smaller_of_the_bandwidth_and_compute_limits() -> None:
    assert physics.decode_tokens_per_second_ceiling(600 * KV_TOKEN, P, F, BW) == pytest.approx(BW / (600 * KV_TOKEN))
    assert physics.decode_tokens_per_second_ceiling(0.0, P, F, BW) == pytest.approx(F / (2 * P))


def test_request_rate_and_pool_groups() -> None:
    # each request: 250 x 20 ms / 256 of decode + 600 x 32 us of prefill
    seconds = physics.engine_seconds_per_request(600, 250, 256, 0.020, 32e-6)
    assert seconds == pytest.approx(250 * 0.020 / 256 + 600 * 32e-6)
    assert physics.sustainable_request_rate(600, 250, 256, 0.020, 32e-6) == pytest.approx(1 / seconds)
    assert physics.sustainable_request_rate(600, 250, 256, 0.020, 32e-6, prefill=False) == pytest.approx(256 / (250 * 0.020))
    assert physics.groups_needed(100 * 2000, 10_000) == 20  # exactly 20, not 21 by float error
    assert physics.groups_needed(100 * 2000 + 1, 10_000) == 21
    assert physics.groups_needed(1, 10_000) == 1


def test_cost_and_tokens_per_joule() -> None:
    assert round(physics.cost_per_million_tokens_on(2.0, 1, 2200), 2) == 0.25  # docs: $2/h at 2,200 tok/s
    assert round(physics.cost_per_million_tokens_on(2.0, 2, 2200), 2) == 0.51  # the same on TP=2
    assert physics.tokens_per_joule(2200, 550) == 4.0


# --- each headroom, saturation ---

def test_kv_headroom_is_zero_once_the_window_preempted() -> None:
    assert hr.kv_headroom(0.6, 0.0) == pytest.approx(0.4)
    assert hr.kv_headroom(0.6, 0.1) == 0.0
    assert hr.kv_headroom(None, 0.0) is None


def test_batch_prefill_and_slo_headroom() -> None:
    assert hr.batch_headroom(64, 256) == 0.75
    assert hr.batch_headroom(64, None) is None
    w = _window(mfu={"prefill": 6000 * 2 * P / F}, slo_tail={"ttft": 1.5, "itl": 0.06})
    assert round(hr.prefill_compute_headroom(w, 0.5), 2) == 0.81  # 6,000 prompt tok/s: MFU 0.097 of 0.5
    assert hr.slo_headrooms(w, hr.SignalSettings(ttft_slo=2.0, itl_slo=0.05)) == {"ttft_slo": 0.25, "itl_slo": 0.0}
    assert hr.slo_headrooms(w, hr.SignalSettings()) == {}  # no SLO configured, no SLO headroom


def test_saturation_is_one_minus_the_roles_smallest_headroom() -> None:
    room = {"kv": 0.4, "batch": 0.75, "decode_bandwidth": 0.76, "prefill_compute": 0.81, "ttft_slo": 0.9}
    assert hr.saturation(room, "both") == (pytest.approx(0.6), "kv")
    assert hr.saturation(room, "prefill") == (pytest.approx(0.19), "prefill_compute")
    assert hr.saturation(room, "decode") == (pytest.approx(0.6), "kv")
    assert hr.saturation({"ttft_slo": 0.5}, "decode") == (None, None)  # none of the role's resources known
    assert hr.saturation({"kv": 0.5, "batch": 0.5}, "both") == (0.5, "kv")  # ties: the first resource


def test_role_from_the_setting_else_the_engine_else_both() -> None:
    assert hr.role_for("decode", "kv_producer") == "decode"
    assert hr.role_for(None, "kv_producer") == "prefill"
    assert hr.role_for(None, "kv_consumer") == "decode"
    assert hr.role_for(None, "null") == "both"
    assert hr.role_for(None, None) == "both"


@pytest.mark.parametrize("bad", [{"role": "router"}, {"ttft_slo": 0.0}, {"gpu_hour_cost": -1.0},
                                 {"decode_mbu": 1.5}, {"itl_slo": float("nan")}])
def test_bad_settings_are_config_errors(bad: dict) -> None:
    with pytest.raises(ConfigError):
        hr.SignalSettings(**bad)


def test_config_reads_role_slos_and_gpu_hour_cost_from_file_and_environment() -> None:
    from rooflight.agent.sampling.config import env_settings

    env = env_settings({"ROOFLIGHT_GPU_HOUR_COST": "2.5", "ROOFLIGHT_ROLE": "Decode", "ROOFLIGHT_ITL_SLO": "50ms"})
    (t,) = build({"ttft_slo": "2s"}, env, {"engine_url": ["http://127.0.0.1:8000"]}).targets
    assert (t.role, t.ttft_slo, t.itl_slo, t.gpu_hour_cost) == ("decode", 2.0, 0.05, 2.5)
    for bad in ({"role": "router"}, {"gpu_hour_cost": "free"}, {"gpu_hour_cost": 0}, {"ttft_slo": "-1s"}):
        with pytest.raises(ConfigError):
            build(bad, {}, {"engine_url": ["http://127.0.0.1:8000"]})


# --- capacity ---

def test_capacity_at_the_mix_before_the_first_wall() -> None:
    # 10 req/s of 600 prompt + 250 output tokens; 20 running at 4% of a 400,000-token cache: 800 tokens each,
    # so the cache holds 500 of them and the batch cap of 256 is the first wall.
    w = _window(requests_per_second=10.0, tokens_per_second={"prefill": 6000.0, "decode": 2500.0},
                mean_running=20.0, mean_kv_usage=0.04)
    cap = hr.capacity(w, REF, 256, 400_000, hr.SignalSettings())
    assert cap is not None and (cap.batch, cap.wall) == (256, "batch")
    step = (W + 256 * 800 * KV_TOKEN) / (BW * 0.7)  # memory-bound at MBU 0.7: 18.3 ms
    assert round(step * 1e3, 1) == 18.3
    per_token = 2 * P / (F * 0.5)
    assert cap.requests_per_second == pytest.approx(1 / (250 * step / 256 + 600 * per_token))
    assert round(cap.requests_per_second, 1) == 26.8
    assert cap.decode_tokens_per_second == pytest.approx(250 * cap.requests_per_second)
    assert cap.phase_tokens_per_second == pytest.approx({"prefill": 1 / per_token, "decode": 256 / step})
    # with a batch cap above what the cache holds, the KV wall binds
    kv = hr.capacity(w, REF, 1024, 400_000, hr.SignalSettings())
    assert kv is not None and (kv.batch, kv.wall) == (pytest.approx(500), "kv")
    # a decode-only pool pays no prefill; a prefill-only pool only prefill
    decode = hr.capacity(w, REF, 256, 400_000, hr.SignalSettings(role="decode"))
    assert decode.requests_per_second == pytest.approx(256 / (250 * step))
    assert set(decode.phase_tokens_per_second) == {"decode"}
    prefill = hr.capacity(w, REF, 256, 400_000, hr.SignalSettings(role="prefill"))
    assert prefill.requests_per_second == pytest.approx(1 / (600 * per_token)) and prefill.wall == "prefill_compute"


def test_capacity_needs_traffic_and_constants() -> None:
    idle = _window(tokens_per_second={"prefill": 0.0, "decode": 0.0}, requests_per_second=0.0)
    assert hr.capacity(idle, REF, 256, 400_000, hr.SignalSettings()) is None
    busy = _window(requests_per_second=10.0, tokens_per_second={"prefill": 6000.0, "decode": 2500.0})
    assert hr.capacity(busy, TargetConstants(model=None, gpu=H100, gpu_source="flag"), 256, 400_000,
                       hr.SignalSettings()) is None
    # nothing running yet: the cache holds capacity / (prompt + output / 2) sequences of this mix
    cap = hr.capacity(busy, REF, 4096, 400_000, hr.SignalSettings())
    assert cap is not None and cap.batch == pytest.approx(400_000 / (600 + 125)) and cap.wall == "kv"
    # no cache size known: the batch cap bounds the batch, each sequence holding the mix's mean context
    capped = hr.capacity(busy, REF, 64, None, hr.SignalSettings())
    step = (W + 64 * 725 * KV_TOKEN) / (BW * 0.7)
    assert capped is not None and (capped.batch, capped.wall) == (64, "batch")
    assert capped.phase_tokens_per_second["decode"] == pytest.approx(64 / step)
    assert hr.capacity(busy, REF, None, None, hr.SignalSettings()) is None


# --- exact values on a scripted engine ---

def _vllm_page(*, running: float, kv: float, prompt: float, generation: float, steps: float, preemptions: float,
               ttft_in_1s: float, itl_in_25ms: float, transferred: float = 0.0) -> str:
    """A vLLM page: a 400,000-token cache (25,000 blocks of 16), every TTFT in (0.5, 1] s, every ITL in
    (10, 25] ms."""
    lab = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} 0",
        "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{{{lab}}} {kv}",
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="25000"} 1.0',
        "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{lab}}} {prompt}",
        "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{lab}}} {generation}",
        "# TYPE vllm:prompt_tokens_by_source_total counter",
        f'vllm:prompt_tokens_by_source_total{{{lab},source="external_kv_transfer"}} {transferred}',
        "# TYPE vllm:num_preemptions_total counter", f"vllm:num_preemptions_total{{{lab}}} {preemptions}",
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {steps}',
        f"vllm:iteration_tokens_total_count{{{lab}}} {steps}", f"vllm:iteration_tokens_total_sum{{{lab}}} 0",
        "# TYPE vllm:time_to_first_token_seconds histogram",
    ]
    for le, count in (("0.5", 0), ("1.0", ttft_in_1s), ("+Inf", ttft_in_1s)):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {count}')
    lines += [f"vllm:time_to_first_token_seconds_count{{{lab}}} {ttft_in_1s}",
              f"vllm:time_to_first_token_seconds_sum{{{lab}}} 0", "# TYPE vllm:inter_token_latency_seconds histogram"]
    for le, count in (("0.01", 0), ("0.025", itl_in_25ms), ("+Inf", itl_in_25ms)):
        lines.append(f'vllm:inter_token_latency_seconds_bucket{{{lab},le="{le}"}} {count}')
    lines += [f"vllm:inter_token_latency_seconds_count{{{lab}}} {itl_in_25ms}",
              f"vllm:inter_token_latency_seconds_sum{{{lab}}} 0"]
    return "\n".join(lines) + "\n"


async def _scripted(engine: FakeEngine, preemptions: float = 0.0, transferred: float = 0.0,
                    **flags: object) -> TargetView:
    """Two samples 10 s apart: 20 running at 4% occupancy, 10 req/s of 600 prompt + 250 output tokens."""
    clock = FakeClock()
    settings = {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "1s", "windows": "10s",
                "model": "ref-8b", "gpu": "h100-sxm", "batch_max": 256, **flags}
    async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
        engine.body = _vllm_page(running=20, kv=0.04, prompt=0, generation=0, steps=0, preemptions=0,
                                 ttft_in_1s=0, itl_in_25ms=0)
        await agent.sample_engines_once()
        clock.advance(10.0)
        engine.body = _vllm_page(running=20, kv=0.04, prompt=60_000, generation=25_000, steps=400,
                                 preemptions=preemptions, ttft_in_1s=100, itl_in_25ms=2_500,
                                 transferred=transferred)
        await agent.sample_engines_once()
        (target,) = agent.snapshot.targets
        return target


async def test_exact_headroom_on_a_scripted_engine(fake_engine: FakeEngine) -> None:
    target = await _scripted(fake_engine)
    (view,) = target.series
    (w,) = view.windows
    assert (w.requests_per_second, w.mean_running, w.mean_kv_usage) == (10.0, 20.0, 0.04)
    assert w.slo_tail == pytest.approx({"ttft": 0.5 + 0.5 * 0.99, "itl": 0.01 + 0.015 * 0.99})
    (s,) = view.signals
    live_per_seq = 0.04 * 400_000 * KV_TOKEN / 20  # 800 tokens of K+V each
    assert s.headroom == pytest.approx({
        "kv": 0.96,
        "batch": 1 - 20 / 256,
        "decode_bandwidth": W / (W + 20 * live_per_seq),
        "prefill_compute": 1 - (6000 * 2 * P / F) / 0.5,
    })
    assert list(s.headroom) == ["kv", "batch", "decode_bandwidth", "prefill_compute"]  # no SLO set: none
    assert s.role == "both" and s.binding == "prefill_compute"
    assert s.saturation == pytest.approx((6000 * 2 * P / F) / 0.5)
    assert s.capacity is not None and round(s.capacity.requests_per_second, 1) == 26.8
    assert s.cost_per_million_tokens == {} and s.tokens_per_joule == {}  # no price, no energy


async def test_slos_and_price_reach_the_signals_and_the_exposition(fake_engine: FakeEngine) -> None:
    target = await _scripted(fake_engine)
    settings = hr.SignalSettings(role="both", ttft_slo=1.25, itl_slo=0.05, gpu_hour_cost=2.0)
    target = replace(target, signal_settings=settings)  # what the sampler passes from the target's config
    (s,) = target.series[0].signals
    assert s.headroom["ttft_slo"] == pytest.approx(1 - 0.995 / 1.25)
    assert s.headroom["itl_slo"] == pytest.approx(1 - 0.02485 / 0.05)
    assert (s.binding, s.saturation) == ("ttft_slo", pytest.approx(0.995 / 1.25))
    assert s.cost_per_million_tokens == pytest.approx({"decode": 2.0 / (2500 * 3600 / 1e6),
                                                       "prefill": 2.0 / (6000 * 3600 / 1e6)})
    samples = _served(target)
    assert samples[(n.SATURATION_BINDING, (("resource", "ttft_slo"), ("role", "both")))] == 1.0
    assert samples[(n.SATURATION, (("role", "both"),))] == pytest.approx(0.995 / 1.25)
    assert samples[(n.HEADROOM, (("resource", "itl_slo"),))] == pytest.approx(1 - 0.02485 / 0.05)
    assert samples[(n.COST_PER_MILLION_TOKENS, (("phase", "decode"),))] == pytest.approx(2.0 / 9.0)
    assert samples[(n.CAPACITY_REQUESTS, ())] == pytest.approx(s.capacity.requests_per_second)
    assert samples[(n.GPU_HOUR_COST, ())] == 2.0


def _served(target: TargetView) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exposition of one target, by (name, labels other than the series' and window's)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rooflight.agent.metrics.snapshot import Snapshot

    text = generate_latest(registry_for(lambda: Snapshot(created=0.0, targets=(target,)))).decode()
    common = {"target", "engine", "model", "rank", "window"}
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in common))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_preemption_in_the_window_puts_kv_at_the_wall(fake_engine: FakeEngine) -> None:
    target = await _scripted(fake_engine, preemptions=3)
    (s,) = target.series[0].signals
    assert s.headroom["kv"] == 0.0 and (s.saturation, s.binding) == (1.0, "kv")


async def test_a_decode_pool_is_judged_by_its_own_walls(fake_engine: FakeEngine) -> None:
    target = replace(await _scripted(fake_engine), signal_settings=hr.SignalSettings(role="decode"))
    (s,) = target.series[0].signals
    # prefill compute binds the shared engine; a decode pool never prefills: its tightest wall is bandwidth
    assert s.binding == "decode_bandwidth" and "prefill_compute" in s.headroom
    live_per_seq = 0.04 * 400_000 * KV_TOKEN / 20
    assert s.saturation == pytest.approx(1 - W / (W + 20 * live_per_seq))


async def test_kv_transfer_tokens_and_bytes(fake_engine: FakeEngine) -> None:
    # 20,000 prompt tokens' KV delivered by a connector in 10 s, on TP=2: 2,000 tokens/s of 128 KiB each
    target = await _scripted(fake_engine, transferred=20_000, tp=2)
    (w,) = target.series[0].windows
    assert w.kv_transfer_tokens_per_second == 2000.0
    assert w.kv_transfer_bytes_per_second == 2000.0 * KV_TOKEN  # 8 KV heads shard evenly over 2 GPUs
    assert w.tokens_per_second["prefill"] == 6000.0  # the computed prompt tokens are still the prefill work
    assert _served(target)[(n.KV_TRANSFER_BYTES, ())] == 2000.0 * KV_TOKEN


# --- energy from NVML's counter (fake NVML) ---

async def test_tokens_per_joule_from_the_energy_counter() -> None:
    clock = FakeClock()
    nvml = h100_like(2)
    collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
    histories = {g.uuid: SeriesHistory(60.0) for g in nvml.gpus}
    try:
        for step in range(2):
            if step:
                clock.advance(10.0)
                for gpu in nvml.gpus:
                    gpu.run_for(10.0)  # at h100_like's 550 W: 5,500,000 mJ more
            sample = await collector.sample()
            for d in sample.devices:
                histories[d.uuid].append(clock.monotonic(), {hr.ENERGY: d.extra.get("energy_joules_total")}, {}, {})
    finally:
        collector.close()
    watts = hr.gpu_energy_watts(histories.values(), 10.0)
    assert watts == pytest.approx(1100.0)  # two GPUs at 550 W
    (w,) = hr.with_energy([_window(tokens_per_second={"prefill": 6000.0, "decode": 2200.0})],
                          lambda seconds: hr.gpu_energy_watts(histories.values(), seconds))
    assert hr.tokens_per_joule(w) == pytest.approx({"decode": 2.0, "prefill": 6000 / 1100})


async def test_no_energy_where_a_gpu_does_not_report_it() -> None:
    clock = FakeClock()
    nvml = h100_like(2)
    nvml.gpus[1].energy_mj = None  # NVML_ERROR_NOT_SUPPORTED on this one
    collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
    histories = {g.uuid: SeriesHistory(60.0) for g in nvml.gpus}
    try:
        for step in range(2):
            clock.advance(10.0 * step)
            nvml.gpus[0].power_mw = 0  # an idle GPU: its counter does not move
            for gpu in nvml.gpus:
                gpu.run_for(10.0 * step)
            for d in (await collector.sample()).devices:
                histories[d.uuid].append(clock.monotonic(), {hr.ENERGY: d.extra.get("energy_joules_total")}, {}, {})
    finally:
        collector.close()
    assert hr.gpu_energy_watts(histories.values(), 10.0) is None  # a partial sum would overstate tokens/J
    assert hr.gpu_energy_watts([histories[nvml.gpus[0].uuid]], 10.0) == 0.0  # the counter did not move
    assert hr.tokens_per_joule(_window(tokens_per_second={"decode": 10.0}, energy_watts=None)) == {}


async def test_a_dynamo_prefill_workers_page_gives_its_role_unless_the_setting_does(fake_engine: FakeEngine) -> None:
    """A real Dynamo 1.6.1 prefill worker's page (component `prefill`): the agent takes role prefill from it;
    a `role` setting still wins; a decode worker's page (an aggregated worker's) leaves both."""
    from support import sample_text

    async def role_of(page: str, **flags: object) -> str:
        settings = {"engine_url": [fake_engine.url], "nvml": False, "process": False, "interval": "1s",
                    "windows": "10s", "model": "ref-8b", "gpu": "h100-sxm", **flags}
        async with started_agent(build({}, {}, settings), loops=False, clock=FakeClock()) as agent:
            fake_engine.body = sample_text(page)
            await agent.sample_engines_once()
            (target,) = agent.snapshot.targets
            return target.signal_settings.role

    assert await role_of("dynamo-1.6.1-mocker-prefill-load.prom") == "prefill"
    assert await role_of("dynamo-1.6.1-mocker-prefill-load.prom", role="decode") == "decode"
    assert await role_of("dynamo-1.6.1-mocker-decode-load.prom") == "both"
