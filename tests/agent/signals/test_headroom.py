"""Headroom, saturation, capacity, cost and energy: the worked numbers of docs/physics.md (section Headroom),
and exact values on a scripted engine whose state is known."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.metrics.snapshot import TargetView
from rooflight.agent.signals.series import with_signals
from rooflight.agent.roofline import physics
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from rooflight.agent.signals import headroom as hr
from rooflight.agent.signals.derive import WindowValues
from rooflight.agent.signals.windows import SeriesHistory
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import h100_like
from support import FakeEngine, started_agent, with_energy

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
    prefill = hr.SignalSettings(role="prefill")  # a prefill pool: no decode time on its GPUs
    assert round(hr.prefill_compute_headroom(w, None, prefill), 2) == 0.81  # 6,000 prompt tok/s: MFU 0.097 of 0.5
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
    from rooflight.agent.config.agent import env_settings

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
               ttft_in_1s: float, itl_in_25ms: float, transferred: float = 0.0, waiting: float = 0.0) -> str:
    """A vLLM page: a 400,000-token cache (25,000 blocks of 16), every TTFT in (0.5, 1] s, every ITL in
    (10, 25] ms."""
    lab = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{lab}}} {running}",
        "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{lab}}} {waiting}",
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
                    spec: tuple[str, str] = ("", ""), waiting: float = 0.0, **flags: object) -> TargetView:
    """Two samples 10 s apart: 20 running at 4% occupancy, 10 req/s of 600 prompt + 250 output tokens."""
    clock = FakeClock()
    settings = {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "1s", "windows": "10s",
                "model": "ref-8b", "gpu": "h100-sxm", "batch_max": 256, **flags}
    async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
        engine.body = _vllm_page(running=20, kv=0.04, prompt=0, generation=0, steps=0, preemptions=0,
                                 ttft_in_1s=0, itl_in_25ms=0, waiting=waiting) + spec[0]
        await agent.sample_engines_once()
        clock.advance(10.0)
        engine.body = _vllm_page(running=20, kv=0.04, prompt=60_000, generation=25_000, steps=400,
                                 preemptions=preemptions, ttft_in_1s=100, itl_in_25ms=2_500,
                                 transferred=transferred, waiting=waiting) + spec[1]
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
    # one GPU does both phases: decode at the batch cap's step (800 tokens of K+V each) plus the prompts
    busy = 2500 * (W + 256 * 800 * KV_TOKEN) / (BW * 0.7) / 256 + (6000 * 2 * P / F) / 0.5
    assert s.headroom == pytest.approx({
        "kv": 0.96,
        "batch": 1 - 20 / 256,
        "decode_bandwidth": 1 - busy,
        "prefill_compute": 1 - busy,
    })
    assert list(s.headroom) == ["kv", "batch", "decode_bandwidth", "prefill_compute"]  # no SLO set: none
    assert s.role == "both" and s.binding == "decode_bandwidth"  # a tie with prefill_compute: the first
    assert s.saturation == pytest.approx(busy)
    assert s.capacity is not None and round(s.capacity.requests_per_second, 1) == 26.8
    assert s.cost_per_million_tokens == {} and s.tokens_per_joule == {}  # no price, no energy


async def test_slos_and_price_reach_the_signals_and_the_exposition(fake_engine: FakeEngine) -> None:
    target = await _scripted(fake_engine)
    settings = hr.SignalSettings(role="both", ttft_slo=1.25, itl_slo=0.05, gpu_hour_cost=2.0)
    target = _with_settings(target, settings)  # what the sampler passes from the target's config
    (s,) = target.series[0].signals
    assert s.headroom["ttft_slo"] == pytest.approx(1 - 0.995 / 1.25)
    assert s.headroom["itl_slo"] == pytest.approx(1 - 0.02485 / 0.05)
    assert (s.binding, s.saturation) == ("ttft_slo", pytest.approx(0.995 / 1.25))
    share = hr.gpu_time_share(target.series[0].windows[0], REF, settings)  # 0.833 decode (the cost test below)
    assert s.cost_per_million_tokens == pytest.approx({"decode": 2.0 * share["decode"] / (2500 * 3600 / 1e6),
                                                       "prefill": 2.0 * share["prefill"] / (6000 * 3600 / 1e6)})
    samples = _served(target)
    assert samples[(n.SATURATION_BINDING, (("resource", "ttft_slo"), ("role", "both")))] == 1.0
    assert samples[(n.SATURATION, (("role", "both"),))] == pytest.approx(0.995 / 1.25)
    assert samples[(n.HEADROOM, (("resource", "itl_slo"),))] == pytest.approx(1 - 0.02485 / 0.05)
    assert samples[(n.COST_PER_MILLION_TOKENS, (("phase", "decode"),))] == pytest.approx(2.0 * share["decode"] / 9.0)
    assert samples[(n.BLENDED_COST_PER_MILLION_TOKENS, ())] == pytest.approx(2.0 / (8500 * 3600 / 1e6))
    assert samples[(n.GPU_TIME_SHARE, (("phase", "prefill"),))] == pytest.approx(share["prefill"])
    assert samples[(n.CAPACITY_REQUESTS, ())] == pytest.approx(s.capacity.requests_per_second)
    assert samples[(n.GPU_HOUR_COST, ())] == 2.0


def _with_settings(target: TargetView, settings: hr.SignalSettings) -> TargetView:
    """The target as the derive step makes it under `settings` (a target's role, SLOs and GPU price)."""
    series = tuple(with_signals(v, target.constants, settings) for v in target.series)
    return replace(target, series=series, signal_settings=settings)


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


async def test_a_queue_behind_the_wall_reaches_the_exposition_past_1(fake_engine: FakeEngine) -> None:
    # The scripted engine preempting (kv headroom 0, saturation 1) with 30 requests waiting behind its 20
    # running: the demand is 1 x (20 + 30) / 20 = 2.5, exported beside a saturation that stays at 1.
    target = await _scripted(fake_engine, preemptions=3, waiting=30)
    (w,) = target.series[0].windows
    assert (w.mean_running, w.mean_waiting) == (20.0, 30.0)
    (s,) = target.series[0].signals
    assert (s.saturation, s.binding, s.demand) == (1.0, "kv", 2.5)
    samples = _served(target)
    assert samples[(n.SATURATION, (("role", "both"),))] == 1.0
    assert samples[(n.SATURATION_DEMAND, (("role", "both"),))] == 2.5


async def test_without_a_queue_the_demand_is_the_saturation(fake_engine: FakeEngine) -> None:
    target = await _scripted(fake_engine)
    (s,) = target.series[0].signals
    assert s.saturation is not None and s.saturation < 1 and s.demand == s.saturation
    assert _served(target)[(n.SATURATION_DEMAND, (("role", "both"),))] == pytest.approx(s.saturation)


async def test_a_decode_pool_is_judged_by_its_own_walls(fake_engine: FakeEngine) -> None:
    target = _with_settings(await _scripted(fake_engine), hr.SignalSettings(role="decode"))
    (s,) = target.series[0].signals
    # prefill compute binds the shared engine; a decode pool never prefills: its tightest wall is bandwidth
    assert s.binding == "decode_bandwidth" and "prefill_compute" in s.headroom
    # its decode load alone: 2,500 tok/s x step(256) / 256 at the batch cap, 800 tokens of K+V each
    assert s.saturation == pytest.approx(2500 * (W + 256 * 800 * KV_TOKEN) / (BW * 0.7) / 256)


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
    (w,) = with_energy([_window(tokens_per_second={"prefill": 6000.0, "decode": 2200.0})],
                          lambda seconds: hr.gpu_energy_watts(histories.values(), seconds))
    share = {"prefill": 0.25, "decode": 0.75}  # each phase's share of the GPU time
    assert hr.tokens_per_joule(w, share) == pytest.approx({"decode": 2200 / 825, "prefill": 6000 / 275})


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
    assert hr.tokens_per_joule(_window(tokens_per_second={"decode": 10.0}, energy_watts=None), {"decode": 1.0}) == {}


# --- each headroom is 1 idle and 0 at its own wall; saturation tracks load / capacity ---

def _steady(**kw: object) -> WindowValues:
    """10 req/s of 600 prompt + 250 output tokens, 20 running at 4% of a 400,000-token cache (800 tokens each)."""
    base: dict[str, object] = dict(requests_per_second=10.0, tokens_per_second={"prefill": 6000.0, "decode": 2500.0},
                                   mean_running=20.0, mean_kv_usage=0.04, mean_live_kv_bytes=20 * 800 * KV_TOKEN,
                                   mfu={"prefill": 6000 * 2 * P / F}, flops_per_second={"prefill": 6000 * 2 * P})
    return _window(**{**base, **kw})


def test_decode_bandwidth_is_zero_when_the_batch_reaches_the_kv_wall() -> None:
    # A decode pool whose cache is full: 500 running at occupancy 1.0 of 400,000 tokens (800 tokens each), batch
    # cap 1,024, so the KV wall is N = 500. At N a step takes (16e9 + 500 x 800 x 131,072) / (3.35e12 x 0.7)
    # = 68.4e9 / 2.345e12 = 29.2 ms, so the pool decodes at most 500 / 29.2 ms = 17,100 tok/s, and it does.
    step = (W + 500 * 800 * KV_TOKEN) / (BW * 0.7)
    assert round(step * 1e3, 1) == 29.2
    at_wall = _window(requests_per_second=500 / step / 250, tokens_per_second={"prefill": 0.0, "decode": 500 / step},
                      mean_running=500.0, mean_kv_usage=1.0, mean_live_kv_bytes=500 * 800 * KV_TOKEN)
    decode = hr.SignalSettings(role="decode")
    room = hr.headrooms(at_wall, REF, 1024, decode, kv_capacity_tokens=400_000)
    assert room["decode_bandwidth"] == pytest.approx(0.0, abs=1e-9)  # was W / (W + B x KV_seq) = 16 / 68.4 = 0.23
    # half that traffic at the same context: half the load, headroom 0.5
    half = replace(at_wall, tokens_per_second={"prefill": 0.0, "decode": 250 / step}, requests_per_second=1 / step)
    assert hr.headrooms(half, REF, 1024, decode, kv_capacity_tokens=400_000)["decode_bandwidth"] == pytest.approx(0.5)
    # idle: 1
    idle = _window(requests_per_second=0.0, tokens_per_second={"prefill": 0.0, "decode": 0.0}, mean_running=0.0,
                   mean_kv_usage=0.0, mean_live_kv_bytes=0.0, mfu={"prefill": 0.0})
    room = hr.headrooms(idle, REF, 1024, hr.SignalSettings(), kv_capacity_tokens=400_000)
    assert room["decode_bandwidth"] == 1.0 and room["prefill_compute"] == 1.0


def test_one_engine_doing_both_phases_spends_one_pool_of_gpu_seconds() -> None:
    # The scripted window under a batch cap of 256 (the first wall; the cache holds 500 of these sequences):
    #   decode load  = 2,500 tok/s x step(256) / 256 = 2,500 x 18.27 ms / 256 = 0.178 (a full batch's share)
    #   prefill load = 6,000 tok/s x 2 x 8e9 / (989e12 x 0.5) = 6,000 x 32.4 us = 0.194
    # so the GPU is 0.3726 busy: both its walls read 1 - 0.3726 = 0.627, and saturation 0.373 = 10 req/s / the
    # capacity of 26.8 req/s (section Capacity at the current mix). The old prefill_compute ignored the
    # decode time (0.806) and saturation read 0.194: half the load.
    step = (W + 256 * 800 * KV_TOKEN) / (BW * 0.7)
    decode_load, prefill_load = 2500 * step / 256, 6000 * 2 * P / (F * 0.5)
    assert (round(decode_load, 3), round(prefill_load, 3)) == (0.178, 0.194)
    s = hr.window_signals(_steady(), REF, 256, 400_000, hr.SignalSettings())
    assert s.headroom["prefill_compute"] == pytest.approx(1 - decode_load - prefill_load)
    assert s.headroom["decode_bandwidth"] == pytest.approx(1 - decode_load - prefill_load)
    assert s.saturation == pytest.approx(10.0 / s.capacity.requests_per_second)  # load / capacity
    assert round(s.saturation, 3) == 0.373
    # a disaggregated pool carries only its own phase
    decode = hr.window_signals(_steady(), REF, 256, 400_000, hr.SignalSettings(role="decode"))
    assert decode.headroom["decode_bandwidth"] == pytest.approx(1 - decode_load)
    prefill = hr.window_signals(_steady(), REF, 256, 400_000, hr.SignalSettings(role="prefill"))
    assert prefill.headroom["prefill_compute"] == pytest.approx(1 - prefill_load)


def test_one_engine_doing_both_phases_names_one_binding_wall_whatever_the_rounding() -> None:
    # Both GPU-time walls carry the same load on one engine, so they tie; the tie goes to decode_bandwidth (the
    # first in RESOURCES) every window. Summed in two orders (1 - d - p against 1 - p - d) they differed in the
    # last bit for about half the mixes, and the binding label flipped between windows of one steady load.
    flips = set()
    for prompt_tokens in range(1000, 9000, 37):
        window = _steady(tokens_per_second={"prefill": float(prompt_tokens), "decode": 2500.0},
                         mfu={"prefill": prompt_tokens * 2 * P / F})
        s = hr.window_signals(window, REF, 256, 400_000, hr.SignalSettings())
        assert s.headroom["decode_bandwidth"] == s.headroom["prefill_compute"]
        flips.add(s.binding)
    assert flips == {"decode_bandwidth"}


# --- demand: the saturation the binding wall would read if the queue ran too (docs/physics.md) ---

def test_saturation_demand_prices_the_queue_at_the_running_sequences_share_of_the_wall() -> None:
    # kv binds at occupancy 0.6 with 30 running: each sequence holds 0.02 of the cache, so 10 more waiting
    # would fill 0.8 of it: 0.6 x (30 + 10) / 30 = 0.8
    assert hr.saturation_demand(0.6, 30.0, 10.0) == pytest.approx(0.8)
    # a pool at its wall (1.0) with 12 running and 25 waiting a pod: 37 / 12 = 3.08 walls' worth
    assert hr.saturation_demand(1.0, 12.0, 25.0) == pytest.approx(37 / 12)
    # no queue, no running sequence to price it by, or no saturation: nothing to add
    assert hr.saturation_demand(0.6, 30.0, 0.0) == 0.6
    assert hr.saturation_demand(0.6, 30.0, None) == 0.6
    assert hr.saturation_demand(0.0, 0.0, 8.0) == 0.0
    assert hr.saturation_demand(None, 30.0, 10.0) is None


def test_at_the_kv_wall_the_demand_is_running_plus_waiting_over_the_walls_batch() -> None:
    # The decode pool above at its KV wall (N = 500 sequences of 800 tokens in 400,000 tokens) with 100
    # waiting: saturation stays 1 (a _ratio), the demand is (500 + 100) / 500 = 1.2 walls' worth.
    step = (W + 500 * 800 * KV_TOKEN) / (BW * 0.7)
    at_wall = _window(requests_per_second=500 / step / 250, tokens_per_second={"prefill": 0.0, "decode": 500 / step},
                      mean_running=500.0, mean_waiting=100.0, mean_kv_usage=1.0,
                      mean_live_kv_bytes=500 * 800 * KV_TOKEN)
    s = hr.window_signals(at_wall, REF, 1024, 400_000, hr.SignalSettings(role="decode"))
    assert (s.saturation, s.binding) == (pytest.approx(1.0), "kv")
    assert s.demand == pytest.approx(1.2)
    # below the wall the same queue adds in proportion: the steady window (0.373) with 5 waiting behind 20
    steady = hr.window_signals(_steady(mean_waiting=5.0), REF, 256, 400_000, hr.SignalSettings())
    assert steady.demand == pytest.approx(steady.saturation * 25 / 20)
    assert round(steady.demand, 3) == 0.466


@pytest.mark.parametrize("role", ["prefill", "both"])
def test_prefill_compute_past_its_setting_is_at_the_wall_not_below_it(role: str) -> None:
    # Prefill MFU 0.6 against the 0.5 setting: 1 - 0.6 / 0.5 = -0.2 unclamped; the headroom is 0 (a wall already
    # passed) and saturation 1.0, never 1.2, so an autoscaling signal stays a ratio.
    w = _window(mfu={"prefill": 0.6}, tokens_per_second={"prefill": 0.6 * F / (2 * P)})
    s = hr.window_signals(w, REF, 256, 400_000, hr.SignalSettings(role=role))
    assert s.headroom["prefill_compute"] == 0.0
    assert (s.saturation, s.binding) == (1.0, "prefill_compute")


# --- cost and energy split by each phase's share of GPU time ---

def test_the_phases_bills_add_up_to_the_gpu_hour() -> None:
    # $2 per GPU-hour, one GPU. The roofline time of the window's work, per second of wall time:
    #   prefill: 6,000 tok/s x 2 x 8e9 / (989e12 x 0.5)                       = 0.194 s
    #   decode:  2,500 tok/s x step(20) / 20, step(20) = (16e9 + 20 x 800 x 131,072) / (3.35e12 x 0.7)
    #            = 18.1e9 / 2.345e12 = 7.72 ms, so 2,500 x 7.72 ms / 20        = 0.965 s
    # shares 0.194 / 1.159 = 0.167 prefill, 0.833 decode. Prefill: $2 x 0.167 / (6,000 x 3,600 / 1e6 = 21.6M
    # tokens/h) = $0.0155 per million; decode $2 x 0.833 / 9M = $0.185. Before: each phase charged the whole
    # $2 ($0.0926 and $0.222), $4/h on a $2 GPU. Blended: $2 / (8,500 x 3,600 / 1e6) = $0.0654.
    prefill_s = 6000 * 2 * P / (F * 0.5)
    step = (W + 20 * 800 * KV_TOKEN) / (BW * 0.7)
    decode_s = 2500 * step / 20
    assert (round(prefill_s, 3), round(step * 1e3, 2), round(decode_s, 3)) == (0.194, 7.72, 0.965)
    share = {"prefill": prefill_s / (prefill_s + decode_s), "decode": decode_s / (prefill_s + decode_s)}
    s = hr.window_signals(_steady(energy_watts=550.0), REF, 256, 400_000, hr.SignalSettings(gpu_hour_cost=2.0))
    assert s.gpu_time_share == pytest.approx(share)
    assert round(s.cost_per_million_tokens["prefill"], 4) == 0.0155
    assert round(s.cost_per_million_tokens["decode"], 3) == 0.185
    per_hour = {"prefill": 21.6, "decode": 9.0}  # millions of tokens per hour
    assert sum(s.cost_per_million_tokens[p] * per_hour[p] for p in per_hour) == pytest.approx(2.0)  # not $4
    assert round(s.blended_cost_per_million_tokens, 4) == 0.0654
    # energy: 550 W split the same way; the joules of both phases add to the GPU's
    assert s.tokens_per_joule == pytest.approx({"prefill": 6000 / (550 * share["prefill"]),
                                                "decode": 2500 / (550 * share["decode"])})
    assert sum(tps / s.tokens_per_joule[p] for p, tps in (("prefill", 6000), ("decode", 2500))) == pytest.approx(550)
    # one phase alone carries the whole bill; TP=2 doubles it
    only = hr.window_signals(_steady(tokens_per_second={"decode": 2500.0}, mfu={}), REF, 256, 400_000,
                             hr.SignalSettings(gpu_hour_cost=2.0))
    assert only.cost_per_million_tokens == pytest.approx({"decode": 2.0 / 9.0})
    tp2 = replace(REF, tensor_parallel_size=2)
    assert hr.window_signals(_steady(tokens_per_second={"decode": 2500.0}, mfu={}), tp2, 256, 400_000,
                             hr.SignalSettings(gpu_hour_cost=2.0)).blended_cost_per_million_tokens == pytest.approx(4 / 9)


# --- capacity under speculative decoding ---

def test_capacity_counts_the_tokens_each_verify_step_yields() -> None:
    # Speculative decoding, k = 4 drafts a step, each accepted with probability 0.7 given the ones before:
    # accepted per draft = 0.7 + 0.49 + 0.343 + 0.24 = 1.77, so a verify step yields 2.77 tokens a sequence
    # (docs/physics.md, section Parallelism, speculation: 1 + a + ... + a^4), as vLLM's counters say:
    # accepted / drafts = 1.77, draft tokens / drafts = 4.
    # At a batch cap of 32, 800 tokens of K+V each: memory (16e9 + 32 x 800 x 131,072) / (3.35e12 x 0.7)
    # = 19.4e9 / 2.345e12 = 8.25 ms; compute 32 sequences x (1 + 4) tokens x 2 x 8e9 / (989e12 x 0.5) = 5.18
    # ms: memory-bound, 8.25 ms a step. Decode alone: 32 x 2.77 / 8.25 ms = 10,800 tok/s, not 3,880.
    tau = 1 + 0.7 + 0.49 + 0.343 + 0.2401
    w = _steady(spec_decode_tokens_per_step=tau, spec_decode_draft_length=4.0)
    step = (W + 32 * 800 * KV_TOKEN) / (BW * 0.7)
    assert round(step * 1e3, 2) == 8.25 and round(32 * 5 * 2 * P / (F * 0.5) * 1e3, 2) == 5.18
    cap = hr.capacity(w, REF, 32, 400_000, hr.SignalSettings())
    assert cap is not None and cap.batch == 32
    assert cap.phase_tokens_per_second["decode"] == pytest.approx(32 * tau / step)
    assert round(cap.phase_tokens_per_second["decode"], -2) == 10_800
    per_token = 2 * P / (F * 0.5)
    assert cap.requests_per_second == pytest.approx(1 / (250 * step / (32 * tau) + 600 * per_token))
    # at a batch cap of 128 the 5 verified tokens a sequence make the step compute-bound: each does 2 x 8e9
    # FLOPs and attends to its sequence's 800 x 32 layer-tokens, 16,384 FLOPs each (+2.6%):
    # 128 x 5 x (16e9 + 0.42e9) / 494.5e12 = 21.3 ms against (16e9 + 128 x 800 x 131,072) / 2.345e12 = 12.6 ms
    big = hr.capacity(w, REF, 128, 400_000, hr.SignalSettings())
    per_token = 2 * P + 16_384 * 800 * 32
    assert big.phase_tokens_per_second["decode"] == pytest.approx(128 * tau / (128 * 5 * per_token / (F * 0.5)))
    # without speculative decoding, one token a step, as before
    plain = hr.capacity(_steady(), REF, 32, 400_000, hr.SignalSettings())
    assert plain.phase_tokens_per_second["decode"] == pytest.approx(32 / step)


def _spec_lines(drafts: float, draft_tokens: float, accepted: float) -> str:
    lab = 'engine="0",model_name="m"'
    return "".join(f"# TYPE vllm:spec_decode_num_{name}_total counter\nvllm:spec_decode_num_{name}_total{{{lab}}} {v}\n"
                   for name, v in (("drafts", drafts), ("draft_tokens", draft_tokens), ("accepted_tokens", accepted)))


async def test_the_verify_steps_yield_comes_from_vllms_counters(fake_engine: FakeEngine) -> None:
    # 1,000 verify steps in the window, 4 drafts each (4,000 draft tokens), 1,770 accepted: k = 4, each step
    # yields 1 + 1.77 = 2.77 tokens a sequence. At the batch cap of 256 a step verifies 256 x 5 tokens:
    # 1,280 x (2 x 8e9 + 800 x 32 x 16,384 of attention) / (989e12 x 0.5) = 42.5 ms of compute against 18.3 ms
    # of streaming, so compute-bound, and the pool decodes 256 x 2.77 / 42.5 ms = 16,700 tok/s (17,100 without
    # the attention).
    target = await _scripted(fake_engine, spec=(_spec_lines(0, 0, 0), _spec_lines(1000, 4000, 1770)))
    (w,) = target.series[0].windows
    assert (w.spec_decode_tokens_per_step, w.spec_decode_draft_length) == (pytest.approx(2.77), 4.0)
    (s,) = target.series[0].signals
    compute = 256 * 5 * (2 * P + 800 * 32 * 16_384) / (F * 0.5)  # 5 verified tokens a sequence: 42.5 ms
    assert round(compute * 1e3, 1) == 42.5
    assert s.capacity.phase_tokens_per_second["decode"] == pytest.approx(256 * 2.77 / compute)
    assert round(s.capacity.phase_tokens_per_second["decode"], -2) == 16_700


# --- capacity under preemption: the finished requests' mix ---

def test_a_preempting_window_is_judged_at_the_finished_requests_mix() -> None:
    # The window preempted; the token mix reads 600 + 250 tokens a request (prefill and decode tokens/s over
    # first tokens/s), the requests that finished averaged 1,500 + 3,500. At the batch cap of 256 (800 tokens
    # of K+V each, step(256) = 18.27 ms): 3,500 x 18.27 ms / 256 + 1,500 x 32.4 us = 0.2498 + 0.0485 = 0.298 s a
    # request, 3.35 req/s, where the token mix gave 26.8.
    w = _steady(preemptions_per_second=1.0, finished_requests_per_second=1.0, finished_mean_prompt_tokens=1500.0,
                finished_mean_output_tokens=3500.0)
    cap = hr.capacity(w, REF, 256, 400_000, hr.SignalSettings())
    step = (W + 256 * 800 * KV_TOKEN) / (BW * 0.7)
    assert cap.requests_per_second == pytest.approx(1 / (3500 * step / 256 + 1500 * 2 * P / (F * 0.5)))
    assert round(cap.requests_per_second, 2) == 3.35
    # without a preemption the token mix stands (it is exact in steady state and needs no finished request)
    calm = replace(w, preemptions_per_second=0.0)
    assert round(hr.capacity(calm, REF, 256, 400_000, hr.SignalSettings()).requests_per_second, 1) == 26.8


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
