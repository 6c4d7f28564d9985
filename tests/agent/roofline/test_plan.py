"""`rooflight plan` reproduces the worked numbers of docs/physics.md, in-process, as text and as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.gpus import ALIASES, get_profile
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import preset
from rooflight.agent.roofline import physics
from rooflight.agent.plan_cli import fetch_live, format_plan, live_series, plan_to_dict, register, window_seconds
from rooflight.agent.roofline.plan import build_plan, build_pool_plan, physics_capacities, sig
from support import MODEL_CONFIGS

FIX = MODEL_CONFIGS
H100 = get_profile("h100-sxm")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rooflight")
    register(ap.add_subparsers(dest="command"))
    return ap


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    args = _parser().parse_args(["plan", *argv])
    assert args.func(args) == 0
    return capsys.readouterr().out


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    return json.loads(run(capsys, *argv, "--json"))


def test_default_plan_is_the_reference_8b_on_one_h100(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys)
    assert (d["model"], d["gpu"], d["tp"], d["context_tokens"]) == ("ref-8b", "h100-sxm", 1, 8000)
    assert d["weight_bytes"] == 16e9
    assert d["kv_bytes_per_token"] == 131_072
    assert round(d["kv_bytes_per_sequence"] / 1e9, 2) == 1.05
    assert d["kv_bytes_free_per_gpu"] == 60e9
    assert d["max_concurrent_sequences"] == 57
    assert round(d["ridge_point"]) == 295
    assert round(d["decode_step_seconds_weights_only"] * 1e3, 1) == 4.8
    assert round(d["decode_tokens_per_second_weights_only"]) == 209
    # the design's 33 TFLOP, 33 ms and 66 ms count the weights' matmuls: 2 x 8e9 x 2,048 = 32.8 TFLOP; the
    # step model adds the prompt's causal attention, 32 layers x 16,384 FLOPs x 2,048 x 2,049 / 2 = 1.10 TFLOP
    attention = 32 * 16_384 * 2048 * 2049 / 2
    assert d["prefill_attention_flops"] == attention
    assert d["prefill_flops"] == 2 * 8e9 * 2048 + attention
    assert round(d["prefill_seconds_at_roof"] * 1e3, 1) == 34.2 and round(d["prefill_seconds"] * 1e3, 1) == 68.5
    assert round(d["kv_weight_crossover_tokens"], -3) == 122_000
    assert d["fits"] is True and d["prefill_memory_bound"] is False


def test_text_carries_the_same_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys)
    for s in ("16 GB total", "131,072 B (128 KiB)", "1.05 GB at 8,000 tokens", "60 GB per GPU",
              "57 at 8,000 tokens", "295 FLOP/byte", "4.78 ms/token, 209 tok/s", "122,000 tokens",
              "33.9 TFLOP", "(causal attention 1.1 TFLOP of it)", "34.2 ms at the compute roof, 68.5 ms at 50% MFU"):
        assert s in out, s


@pytest.mark.parametrize("context,weights_only,intensity", [(600, 49, 49.6), (8000, 12, 15.6)])
def test_decode_intensity_at_batch_64(capsys: pytest.CaptureFixture[str], context: int, weights_only: int,
                                      intensity: float) -> None:
    # The design's 49 and 12 count the weights' FLOPs, 64 x 2 x 8e9 over 16e9 + 64 x the caches; the step model
    # adds the attention each token does over its cache, 16,384 FLOPs per cached token and layer: 4 FLOP per
    # byte of KV read (GQA's 4 query heads a KV head), so at 8,000 tokens a third, not a quarter, of 64
    d = run_json(capsys, "--batch", "64", "--context", str(context))
    kv = 64 * context * 131_072
    assert round(64 * 2 * 8e9 / (16e9 + kv)) == weights_only
    assert d["decode_intensity_at_batch"] == pytest.approx((64 * 2 * 8e9 + 64 * 32 * 16_384 * context) / (16e9 + kv))
    assert round(d["decode_intensity_at_batch"], 1) == intensity


@pytest.mark.parametrize("context,tok_s", [(1_000, 208), (100_000, 115)])
def test_decode_ceiling_with_kv(capsys: pytest.CaptureFixture[str], context: int, tok_s: int) -> None:
    assert round(run_json(capsys, "--context", str(context))["decode_tokens_per_second_at_context"]) == tok_s


def test_70b_at_tp4(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--model", "ref-70b", "--tp", "4")
    assert d["weight_bytes"] == 140e9 and d["weight_bytes_per_gpu"] == 35e9
    assert d["kv_bytes_per_token"] == 327_680
    assert round(d["kv_bytes_per_sequence"] / 1e9, 2) == 2.62
    assert d["kv_bytes_free_per_gpu"] == 41e9 and d["kv_bytes_free_total"] == 164e9
    assert d["max_concurrent_sequences"] == 62
    assert round(d["decode_step_seconds_weights_only"] * 1e3, 1) == 10.4
    step = d["decode_step_seconds_weights_only"] + d["tp_allreduce_seconds_per_token"]
    assert round(step * 1e3, 1) == 11.2 and round(1 / step, -1) == 90


def test_70b_on_one_h100_does_not_fit_and_is_42_ms(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--model", "ref-70b", "--prompt-tokens", "4096", "--prefill-mfu", "1")
    assert d["fits"] is False and d["max_concurrent_sequences"] == 0
    assert round(d["decode_step_seconds_weights_only"] * 1e3) == 42
    # 2 x 70e9 x 4,096 / 989e12 = 0.58 s of the weights' matmuls, + 80 x 32,768 (64 heads x 2 x 256 dims) x
    # 4,096 x 4,097 / 2 = 22.0 TFLOP of attention
    assert d["prefill_seconds"] == pytest.approx((2 * 70e9 * 4096 + 80 * 32_768 * 4096 * 4097 / 2) / 989e12)
    assert round(d["prefill_seconds"], 2) == 0.60
    assert "DOES NOT FIT" in run(capsys, "--model", "ref-70b")


def test_int8_weights_and_fp8_kv(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--weight-dtype", "int8")
    assert d["weight_bytes"] == 8e9
    assert round(d["decode_step_seconds_weights_only"] * 1e3, 2) == 2.39
    assert round(d["decode_tokens_per_second_weights_only"]) == 419
    assert run_json(capsys, "--kv-dtype", "fp8")["kv_bytes_per_token"] == 65_536


def test_head_of_line_prefill(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--prompt-tokens", "8000")
    # the design's 128 TFLOP and 259 ms are the weights' matmuls; an 8,000-token prompt's causal attention adds
    # 32 x 16,384 x 8,000 x 8,001 / 2 = 16.8 TFLOP (13%)
    assert d["prefill_flops"] == 128e12 + 32 * 16_384 * 8000 * 8001 / 2
    assert round(d["prefill_seconds"] * 1e3) == 293
    assert run_json(capsys, "--prompt-tokens", "200")["prefill_memory_bound"] is True


def test_paged_batch_of_760(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--context", "600", "--batch", "760")
    assert round(d["decode_step_seconds_at_batch"] * 1e3, 1) == 22.6
    assert round(d["decode_tokens_per_second_at_batch"], -2) == 33_600
    assert round(d["max_concurrent_sequences"], -1) == 760
    naive = run_json(capsys, "--context", "600", "--batch", "57")
    assert round(naive["decode_step_seconds_at_batch"] * 1e3, 1) == 6.1


@pytest.mark.parametrize("gpu,ridge", [("h200", 206), ("a100-sxm-80gb", 153), ("a100-pcie-80gb", 161)])
def test_other_gpus_ridges(capsys: pytest.CaptureFixture[str], gpu: str, ridge: int) -> None:
    # The often-quoted "A100 ~156" rounds 2,039 GB/s to 2.0 TB/s; the profile keeps the datasheet figure.
    assert round(run_json(capsys, "--gpu", gpu)["ridge_point"]) == ridge


def test_405b_needs_more_than_tp8(capsys: pytest.CaptureFixture[str]) -> None:
    d = run_json(capsys, "--model", "llama-3-405b", "--tp", "8")
    assert round(d["weight_bytes_per_gpu"] / 1e9) == 101 and d["fits"] is False


def test_model_config_and_hf_id(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_json(capsys, "--model-config", str(FIX / "llama-3-8b.json"))
    b = run_json(capsys, "--model", "meta-llama/Meta-Llama-3-8B-Instruct")
    assert a["params_total"] == b["params_total"] == 8_030_261_248
    assert a["model_source"].startswith("config.json:") and b["model_source"] == "preset:llama-3-8b"
    # a step reads every weight but the input table (128,256 x 4,096, a row a token), as the live MBU counts:
    # 1 / ((16,060,522,496 - 1,050,673,152 + 8,192) / 3.35e12) = 223 tok/s, where every weight read 209
    assert a["decode_step_seconds_weights_only"] == pytest.approx((16_060_522_496 - 1_050_673_152 + 8192) / 3.35e12)
    assert round(a["decode_tokens_per_second_weights_only"]) == 223


def test_moe_streams_only_touched_experts() -> None:
    m = preset("mixtral-8x7b")
    one = build_plan(m, H100, tp=2, context_tokens=1000, batch=1, prompt_tokens=100)
    many = build_plan(m, H100, tp=2, context_tokens=1000, batch=256, prompt_tokens=100)
    table = 2 * 32_000 * 4096  # the input embeddings: a row a token
    assert one.weight_bytes_streamed_per_step == pytest.approx(2 * m.params_active - table + 2 * 4096)
    assert many.weight_bytes_streamed_per_step == pytest.approx(m.weight_bytes - table + 256 * 2 * 4096, rel=1e-6)
    assert "weights read a step" in format_plan(one)


def test_mla_kv_is_held_whole_on_every_tp_rank() -> None:
    m = load_config_json(FIX / "deepseek-v3-mla.json")
    p = build_plan(m, get_profile("h200"), tp=8, context_tokens=10_000, batch=1, prompt_tokens=10)
    assert p.kv_bytes_per_sequence == 61 * 576 * 2 * 10_000
    per_gpu_free = 141e9 - m.weight_bytes / 8 - 4e9
    assert p.max_concurrent_sequences == per_gpu_free // p.kv_bytes_per_sequence


@pytest.mark.parametrize("kw,match", [
    ({"tp": 0}, "at least 1"), ({"batch": 0}, "at least 1"), ({"prefill_mfu": 1.5}, "prefill-mfu"),
    ({"tp": 3}, "cannot be split"),
])
def test_bad_inputs_are_config_errors(kw: dict, match: str) -> None:
    args = {"tp": 1, "context_tokens": 8000, "batch": 1, "prompt_tokens": 2048, **kw}
    with pytest.raises(ConfigError, match=match):
        build_plan(preset("ref-8b"), H100, **args)


def test_unknown_model_and_gpu_are_config_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="llama-3-8b"):
        run(capsys, "--model", "no-such-model")
    with pytest.raises(ConfigError, match="h100-sxm"):
        run(capsys, "--gpu", "tpu-v5")
    with pytest.raises(ConfigError, match="not a multiple"):
        run(capsys, "--model-config", str(FIX / "broken-heads.json"))


def test_plan_to_dict_is_json_and_complete() -> None:
    p = build_plan(preset("ref-8b"), H100, tp=1, context_tokens=8000, batch=1, prompt_tokens=2048)
    d = plan_to_dict(p)
    assert json.loads(json.dumps(d)) == d
    assert set(d) == set(p.__dataclass_fields__)


@pytest.mark.parametrize("x,s", [(4.776, "4.78"), (33_628, "33,600"), (0.5798, "0.58"), (295.2, "295"),
                                 (16.0, "16"), (122_070, "122,000"), (1.0486, "1.05")])
def test_sig(x: float, s: str) -> None:
    assert sig(x) == s


def test_list_shows_presets_and_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, "--list")
    assert "llama-3-8b" in out and "deepseek-v3" in out and "37.6B active" in out
    assert "h100-sxm         989 TFLOP/s bf16, 3.35 TB/s, 80 GB, ridge 295 (also h100, h100-sxm5)" in out
    # every spelling --gpu takes is listed, each beside the profile it means
    listed = {line.split()[0]: set(line.split("(also ", 1)[1].rstrip(")").split(", "))
              for line in out.splitlines() if "(also " in line}
    assert listed == {key: {a for a, k in ALIASES.items() if k == key} for key in set(ALIASES.values())}


# --- pools and the live agent (docs/physics.md, section Headroom) ---

def test_disaggregated_pools_for_100_requests_per_second(capsys: pytest.CaptureFixture[str]) -> None:
    # 100 req/s of 2,000 prompt + 250 output tokens, ~10,000 prefill and ~2,500 decode tok/s per group
    d = run_json(capsys, "--rate", "100", "--prompt", "2000", "--output", "250",
                 "--prefill-capacity", "10000", "--decode-capacity", "2500")["pools"]
    # the design documents' 20 prefill groups are the pool at 100% busy; at a 0.5 s p99 TTFT it takes 23
    # (test_prefill_pool_is_sized_for_the_p99_ttft)
    # the decode pool: a group decodes 2,500 tok/s, at the 50 ms ITL 125 sequences at once; 100 req/s hold
    # 250 x 50 ms = 12.5 s a slot, 1,250 slots busy on average: 10 groups (1,250 slots) are over half the time,
    # 11 (1,375) leave 0.02% of requests waiting for one (Erlang C), the 1% tail the pools are sized at
    assert (d["prefill_groups_at_full_load"], d["prefill_groups"]) == (20, 23)
    assert (d["decode_groups_at_full_load"], d["decode_groups"], d["decode_slots_per_group"]) == (10, 11, 125)
    assert physics.erlang_c(1250, 1250.0) == 1.0 and physics.erlang_c(1375, 1250.0) < 0.01
    assert d["shared_groups_at_full_load"] == 30 and d["share"] is False  # 0.2 s per prompt: past a 50 ms ITL
    out = run(capsys, "--rate", "100", "--prompt", "2000", "--output", "250", "--prefill-capacity", "10000",
              "--decode-capacity", "2500")
    assert "prefill pool            23 groups at 87% busy" in out and "= 20 groups' work; the rest is room for the queue" in out
    assert "decode pool             11 groups at 90.9% busy" in out and "10 at 100%" in out
    assert "Verdict: split: 23 prefill + 11 decode groups" in out


@pytest.mark.parametrize(("rate", "prompt", "why"), [
    (1, 2000, "too small a fleet"),  # 0.2 + 0.1 groups: one shared group, not one of each
    (100, 200, "within the 50 ms ITL budget"),  # 20 ms of prefill per prompt: short prompts
])
def test_sharing_one_pool_is_sometimes_the_better_answer(rate: float, prompt: float, why: str) -> None:
    p = build_pool_plan(rate, prompt, 250, 10_000, 2_500)
    assert p.share is True and any(why in r for r in p.reasons)
    assert p.shared_groups <= p.prefill_groups + p.decode_groups


def test_pool_capacities_from_the_physics(capsys: pytest.CaptureFixture[str]) -> None:
    # ref-8b on one H100, 2,000 + 250 tokens: prefill at 50% MFU; decode at the KV wall's batch
    # (60 GB / (2,125 tokens x 128 KiB) = 215 sequences) at 70% of the bandwidth peak
    prefill, decode, batch, kv, step = physics_capacities(preset("ref-8b"), H100, tp=1, prompt_tokens=2000,
                                                           output_tokens=250, batch_max=256, prefill_mfu=0.5,
                                                           decode_mbu=0.7, reserved_bytes_per_gpu=4e9)
    # a prompt: 2 x 8e9 x 2,000 + its causal attention 32 x 16,384 x 2,000 x 2,001 / 2 = 33.05 TFLOP at
    # 494.5 TFLOP/s = 66.8 ms, 29,900 tok/s (30,900 without the attention)
    assert prefill == pytest.approx(2000 / ((2 * 8e9 * 2000 + 32 * 16_384 * 2000 * 2001 / 2) / (989e12 * 0.5)))
    assert round(prefill, -2) == 29_900 and batch == 215
    assert step == pytest.approx((16e9 + 215 * 2125 * 131_072) / (3.35e12 * 0.7))  # its 7.4 ms of FLOPs are under it
    assert decode == pytest.approx(215 / step) and round(decode, -1) == 6_640
    assert kv == 2000 * 131_072
    d = run_json(capsys, "--rate", "100", "--prompt", "2000", "--output", "250")["pools"]
    # 7 prefill GPUs at 100% busy (the design documents' figure); at the 0.5 s p99 TTFT 8: a prompt takes
    # 66.8 ms, a = 6.68; M/M/c at c = 7: P(wait > 0.433 s) = 0.11 > 1%; c = 8: 1.1e-4. Decode: step(215) =
    # 32.4 ms meets the 50 ms ITL, so the KV wall's batch stays; 25,000 tok/s are 3.76 GPUs' work, but each
    # request holds a slot 250 x 32.4 ms = 8.1 s, 809 slots busy on average: 4 GPUs' 860 slots leave 4.7% of
    # requests waiting for one, 5 GPUs' 1,075 none (the 1% tail)
    assert physics.mmc_wait_exceeds(7, 100, 2000 / prefill, 0.5 - 2000 / prefill) > 0.01
    assert physics.mmc_wait_exceeds(8, 100, 2000 / prefill, 0.5 - 2000 / prefill) < 0.01
    assert (d["prefill_groups_at_full_load"], d["prefill_groups"]) == (7, 8)
    assert physics.erlang_c(860, 100 * 250 * step) > 0.01 > physics.erlang_c(1075, 100 * 250 * step)
    assert (d["decode_groups_at_full_load"], d["decode_groups"], d["decode_batch"], d["capacity_source"]) == (
        4, 5, 215, "physics")


def test_a_compute_bound_decode_pool_runs_at_the_prefill_mfu_share_of_the_compute_peak() -> None:
    # ref-8b on one H100, 100 + 100 tokens (live context 150), up to 1,024 sequences: KV 150 x 128 KiB = 19.7 MB
    # a sequence, 60 GB hold 3,051, so the cap's 1,024 decode. A step reads 16 GB of weights + 1,024 x 19.7 MB
    # = 36.1 GB (15.4 ms at 70% of 3.35 TB/s) and runs 2 x 8e9 x 1,024 + 32 x 16,384 x 150 x 1,024 = 16.46
    # TFLOP: 33.3 ms at 50% of 989 TFLOP/s, the longer, so 30,800 tok/s. At the whole compute peak the
    # step would be 16.6 ms and the pool twice as fast as the GEMMs can run.
    prefill, decode, batch, kv, step = physics_capacities(preset("ref-8b"), H100, tp=1, prompt_tokens=100,
                                                           output_tokens=100, batch_max=1024, prefill_mfu=0.5,
                                                           decode_mbu=0.7, reserved_bytes_per_gpu=4e9)
    flops = 2 * 8e9 * 1024 + 32 * 16_384 * 150 * 1024
    assert batch == 1024
    assert step == pytest.approx(flops / (989e12 * 0.5))
    assert step > (16e9 + 1024 * 150 * 131_072) / (3.35e12 * 0.7)  # compute-bound
    assert decode == pytest.approx(1024 / step) and round(decode, -2) == 30_800


def test_pool_flags_must_make_sense(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--prompt and --output"):
        run(capsys, "--rate", "10")
    with pytest.raises(ConfigError, match="--rate"):
        build_pool_plan(0, 100, 100, 1000, 1000)
    with pytest.raises(ConfigError, match="raise --tp"):
        physics_capacities(preset("ref-70b"), H100, tp=1, prompt_tokens=2000, output_tokens=250, batch_max=256,
                           prefill_mfu=0.5, decode_mbu=0.7, reserved_bytes_per_gpu=4e9)


def test_live_windows_are_read_as_the_agent_reads_its_windows() -> None:
    assert [window_seconds(w) for w in ("10s", "1m", "250ms", "1h", "x")] == [10, 60, 0.25, 3600, 0]


async def _demo_page() -> tuple[str, object]:
    """A live agent's /metrics on the demo's steady traffic, and its TargetView."""
    from prometheus_client import generate_latest

    from rooflight.agent.demo import DemoConfig, DemoEngine
    from rooflight.agent.metrics.exposition import registry_for
    from rooflight.agent.sampling.clock import FakeClock
    from rooflight.agent.config.agent import build
    from support import started_agent

    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario="steady", seed=3), clock=clock)
    await engine.start()
    try:
        settings = {"engine_url": [engine.url], "process": False, "nvml": False, "interval": "0.5",
                    "windows": "10s,1m", "gpu": "h100-sxm", "batch_max": 256}
        async with started_agent(build({}, {}, settings), loops=False, clock=clock) as agent:
            for _ in range(80):
                clock.advance(0.5)
                engine.tick()
                await agent.sample_engines_once()
            return generate_latest(registry_for(lambda: agent.snapshot)).decode(), agent.snapshot.targets[0]
    finally:
        await engine.stop()


async def test_from_live_reads_the_agents_signals(capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from support import FakeEngine

    page, target = await _demo_page()
    (live,) = live_series(page)  # the longest window by default
    view = target.series[0]
    w, s = view.windows[-1], view.signals[-1]
    assert live.window == "1m" and live.role == "both"
    assert live.requests_per_second == pytest.approx(w.requests_per_second)
    assert live.headroom == pytest.approx(dict(s.headroom)) and live.binding == s.binding
    assert live.capacity_requests_per_second == pytest.approx(s.capacity.requests_per_second)
    assert live.mix() == pytest.approx((w.tokens_per_second["prefill"] / w.requests_per_second,
                                        w.tokens_per_second["decode"] / w.requests_per_second))
    assert live_series(page, "10s")[0].window == "10s"
    with pytest.raises(ConfigError, match="serves 10s, 1m"):
        live_series(page, "5m")
    agent = FakeEngine(body=page)  # the agent's page, served over HTTP
    await agent.start()
    try:
        out = await asyncio.to_thread(run, capsys, "--from-live", agent.url, "--rate", "50")
    finally:
        await agent.stop()
    assert "window 1m, role both" in out and f"capacity at this mix    {sig(live.capacity_requests_per_second)} req/s" in out
    assert "(the live agent; decode batch" in out  # pool capacities and mix from the live agent's one-phase capacities
    # its decode slots: the batch at its first wall, each stepping every batch / decode capacity
    decode = live.capacity_phase_tokens_per_second["decode"]
    assert live.capacity_decode_batch == s.capacity.batch
    pools = build_pool_plan(50, *live.mix(), live.capacity_phase_tokens_per_second["prefill"], decode, source="live",
                            decode_batch=s.capacity.batch, decode_step_seconds=s.capacity.batch / decode)
    assert f"prefill pool            {pools.prefill_groups} group" in out
    assert f"decode pool             {pools.decode_groups} group" in out


def test_from_live_that_is_not_readable_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    from support import free_port

    with pytest.raises(ConfigError, match="cannot read it"):
        run(capsys, "--from-live", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match="agent's URL"):
        run(capsys, "--from-live", "ftp://example")


def _http_server(answer: Callable[[Any], None]) -> tuple[Any, int]:
    """A local HTTP server on a thread, `answer(handler)` answering each GET; returns (server, port)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's spelling)
            answer(self)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]


def test_from_live_does_not_follow_a_redirect_with_the_credentials() -> None:
    seen: list[str | None] = []

    def elsewhere(h: Any) -> None:
        seen.append(h.headers.get("Authorization"))
        h.send_response(200)
        h.send_header("Content-Length", "0")
        h.end_headers()

    other, other_port = _http_server(elsewhere)

    def redirect(h: Any) -> None:
        h.send_response(302)
        h.send_header("Location", f"http://127.0.0.1:{other_port}/metrics")
        h.send_header("Content-Length", "0")
        h.end_headers()

    first, port = _http_server(redirect)
    try:
        with pytest.raises(ConfigError, match="redirect; not followed") as caught:
            fetch_live(f"http://alice:s3cret@127.0.0.1:{port}/")
    finally:
        first.shutdown()
        other.shutdown()
    assert seen == []  # before: the other server got "Basic YWxpY2U6czNjcmV0"
    assert "s3cret" not in str(caught.value) and "alice" not in str(caught.value)


@pytest.mark.parametrize("page", [
    'rooflight_headroom_ratio{window="1m",resource="kv"} not-a-number\n',
    'rooflight_headroom_ratio{window="1m" 1\n',
    'rooflight_headroom_ratio{window="1m",resource="kv"}\n',  # no value at all
])
def test_from_live_with_a_page_that_is_not_prometheus_text_is_a_config_error(page: str) -> None:
    with pytest.raises(ConfigError, match="not a Prometheus text page"):
        live_series(page)


def test_a_model_config_that_never_ends_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rooflight.agent import model_files as models

    if Path("/dev/zero").exists():
        with pytest.raises(ConfigError, match="larger than 16 MiB"):
            load_config_json("/dev/zero")  # before: read until memory ran out (4 GB and more)
    monkeypatch.setattr(models, "MAX_CONFIG_JSON_BYTES", 1024)
    big = tmp_path / "config.json"
    big.write_text(json.dumps({"model_type": "llama", "pad": "x" * 2000}))
    with pytest.raises(ConfigError, match="larger than"):
        load_config_json(big)
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "config.json").write_text(json.dumps({"model_type": "llama", "x": "y" * 1200}))
    with pytest.raises(ConfigError, match="larger than"):
        load_config_json(tmp_path / "small")  # a directory: its config.json, capped the same


# --- pools sized at the SLO, the verdict on the physics, TP communication ---

def test_prefill_pool_is_sized_for_the_p99_ttft() -> None:
    # 100 req/s of 2,000-token prompts at 10,000 prefill tok/s per group: each prompt holds a group S = 0.2 s,
    # offered load a = 100 x 0.2 = 20 groups. ceil(a) = 20 groups run 100% busy and the queue never drains.
    # M/M/c: P(wait > t) = C(c, a) x exp(-(c / S - rate) x t), t = 0.5 - 0.2 = 0.3 s of the p99 TTFT budget:
    #   c = 22: C = 0.568, x exp(-(110 - 100) x 0.3) = x 0.0498 -> 0.028 > 1%
    #   c = 23: C = 0.416, x exp(-(115 - 100) x 0.3) = x 0.0111 -> 0.0046 <= 1%: 23 groups, 20 / 23 = 87% busy
    assert round(physics.erlang_c(22, 20.0), 3) == 0.568 and round(physics.erlang_c(23, 20.0), 3) == 0.416
    p = build_pool_plan(100, 2000, 250, 10_000, 2_500, ttft_slo=0.5)
    assert (p.prefill_groups, p.prefill_groups_at_full_load) == (23, 20)
    assert p.prefill_utilization == pytest.approx(20 / 23)
    # a looser target needs fewer, never fewer than the load; one prompt past the target: no pool meets it
    assert 20 < build_pool_plan(100, 2000, 250, 10_000, 2_500, ttft_slo=2.0).prefill_groups < 23
    with pytest.raises(ConfigError, match="TTFT target"):
        build_pool_plan(100, 2000, 250, 10_000, 2_500, ttft_slo=0.2)


def test_decode_is_sized_at_the_batch_whose_itl_meets_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    # ref-8b on one H100 at 2,000 + 250 tokens: each sequence holds 2,125 x 131,072 = 278.5 MB; the KV wall is
    # 215 sequences, step(215) = 32.4 ms. At a 20 ms ITL the batch is the largest B with
    # (16e9 + B x 278.5e6) / (3.35e12 x 0.7) <= 20 ms: B <= (46.9e9 - 16e9) / 278.5e6 = 110.9, so 110, step
    # 19.9 ms, 110 / 19.9 ms = 5,531 tok/s a GPU; 25,000 tok/s are 4.52 GPUs' work -> 5 at 100%, not the KV
    # wall's 4; and with the 1% tail (a request holds a slot 250 x 19.9 ms = 4.97 s, 497 busy on average) 6:
    # 5 GPUs' 550 slots leave 1.2% of requests waiting for one.
    kw = dict(tp=1, prompt_tokens=2000, output_tokens=250, batch_max=256, prefill_mfu=0.5, decode_mbu=0.7,
              reserved_bytes_per_gpu=4e9)
    _, decode, batch, _, _ = physics_capacities(preset("ref-8b"), H100, itl_slo=0.02, **kw)
    assert batch == 110 and round(decode) == 5531
    assert physics_capacities(preset("ref-8b"), H100, itl_slo=None, **kw)[2] == 215  # the KV wall, as before
    d = run_json(capsys, "--rate", "100", "--prompt", "2000", "--output", "250", "--itl-slo", "0.02")["pools"]
    assert (d["decode_groups_at_full_load"], d["decode_groups"], d["decode_batch"]) == (5, 6, 110)
    assert physics.erlang_c(550, 100 * 250 * d["decode_step_seconds"]) > 0.01
    with pytest.raises(ConfigError, match="ITL target"):  # even one sequence's step is 6.8 ms
        physics_capacities(preset("ref-8b"), H100, itl_slo=0.005, **kw)


def test_the_share_or_split_verdict_does_not_flip_on_rounding(capsys: pytest.CaptureFixture[str]) -> None:
    # Llama-3-70B on TP4 H100s at 2,000 + 250 tokens: one prompt's prefill holds a group 161 ms, past the
    # 50 ms ITL a shared pool's decodes would wait, and each pool carries many groups' work: split at every
    # rate. The old rule (share whenever ceil(a + b) < ceil(a) + ceil(b)) flipped between 1,000 and 1,050 req/s.
    verdicts = set()
    for rate in range(1000, 1051):
        d = run_json(capsys, "--model", "llama-3-70b", "--tp", "4", "--rate", str(rate), "--prompt", "2000",
                     "--output", "250")["pools"]
        verdicts.add(d["share"])
        assert d["prefill_seconds_per_prompt"] > d["itl_slo"]
    assert verdicts == {False}
    # still share where the physics says so: a tiny fleet (0.2 + 0.1 groups' work), short prompts (20 ms)
    assert build_pool_plan(1, 2000, 250, 10_000, 2_500).share is True
    assert build_pool_plan(1000, 200, 250, 10_000, 2_500).share is True


def test_tp_all_reduces_in_the_ceilings_and_the_pools() -> None:
    # 70B at TP4 on NVLink: 2 all-reduces x 80 layers, each 5 us + 2 x 3/4 x payload / 450 GB/s.
    # Batch 128: payload 128 x 8,192 x 2 B = 2.10 MB -> 6.99 us, so 160 x 11.99 us = 1.92 ms a step.
    # A 2,048-token prompt: 33.6 MB -> 111.8 us, so 160 x 116.8 us = 18.7 ms on top of its 146 ms.
    m = preset("llama-3-70b")
    plan = build_plan(m, H100, tp=4, context_tokens=8000, batch=128, prompt_tokens=2048)
    assert round(plan.tp_allreduce_seconds_at_batch * 1e3, 2) == 1.92
    assert plan.decode_step_seconds_at_batch_with_tp == pytest.approx(plan.decode_step_seconds_at_batch + 1.918e-3,
                                                                       rel=1e-3)
    assert round(plan.prefill_tp_allreduce_seconds * 1e3, 1) == 18.7
    # the design example's 35.6 ms reads every weight; the step model reads the input table a row a token:
    # (141,107,412,992 - 2,101,346,304 + 128 x 16,384 + 128 x 8,000 x 327,680) / (4 x 3.35e12) = 35.41 ms
    assert plan.decode_step_seconds_at_batch == pytest.approx(
        (141_107_412_992 - 2_101_346_304 + 128 * 16_384 + 128 * 8000 * 327_680) / (4 * 3.35e12))
    one = build_plan(preset("ref-8b"), H100, tp=1, context_tokens=8000, batch=128, prompt_tokens=2048)
    assert one.tp_allreduce_seconds_at_batch == 0 and one.prefill_tp_allreduce_seconds == 0
    # the pool's prefill capacity pays them: 2,000 tokens of 2 x 68.45e9 (not the input table, not the LM head)
    # + their causal attention 80 x 32,768 x 2,000 x 2,001 / 2, and the LM head once, in 141.1 ms at 4 x 989e12
    # x 0.5; + 160 x (5 us + 1.5 x 32.8 MB / 450 GB/s = 109.2 us) = 18.3 ms: 2,000 / 159.4 ms = 12,550 tok/s
    prefill, *_ = physics_capacities(m, H100, tp=4, prompt_tokens=2000, output_tokens=250, batch_max=256,
                                     prefill_mfu=0.5, decode_mbu=0.7, reserved_bytes_per_gpu=4e9)
    table = 128_256 * 8192
    flops = 2000 * 2 * (m.params_active - 2 * table) + 80 * 32_768 * 2000 * 2001 / 2 + 2 * table
    assert prefill == pytest.approx(2000 / (flops / (4 * 989e12 * 0.5) + 160 * (5e-6 + 1.5 * 2000 * 8192 * 2 / 450e9)))
    assert round(prefill, -2) == 12_600


def test_the_running_batchs_context_is_length_biased() -> None:
    from rooflight.agent.roofline.plan import running_context

    # outputs of 100 and 300 tokens, half each (mean 200, sd 100, cv 0.5), 500-token prompts: the 300-token
    # ones are in the batch 3 steps for every 1 of the others, so its mean context is
    # (100 x (500 + 50) + 300 x (500 + 150)) / 400 = 625 = 500 + 200 x (1 + 0.25) / 2, not 500 + 100
    assert running_context(500, 200, 0.5) == (100 * 550 + 300 * 650) / 400 == 625
    assert running_context(500, 200) == 600
