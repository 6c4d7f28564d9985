"""Capacity, headroom, saturation, the cost split and the live MBU/MFU on the step model, worked by hand from the
published config.json and datasheet figures (docs/physics.md, section The step model): expert parallelism,
prefix-cache hits, a draft model, a hybrid KV pool, MoE coverage step by step, attention over the spread of
prompt lengths."""

from __future__ import annotations

import pytest

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.gpus import get_profile
from rooflight.agent.roofline.models import preset
from rooflight.agent.signals import headroom as hr
from rooflight.agent.signals.derive import WindowValues
from rooflight.collectors.samples import Histogram
from rooflight.collectors.vllm import ITERATION_TOKENS_EDGES, request_token_edges
from test_derive_served import _series, _window

H100, H200 = get_profile("h100-sxm"), get_profile("h200")
TABLE_8B = 128_256 * 4096  # Llama-3-8B's untied input embeddings (and LM head), parameters
MATMUL_8B = 8_030_261_248 - TABLE_8B  # what a decode token multiplies
PROMPT_8B = 8_030_261_248 - 2 * TABLE_8B  # what a prompt token that needs no logits multiplies
PAIR_8B = 2 * 32 * (128 + 128)  # attention FLOPs of one token pair in one layer


def _histogram(edges: tuple[float, ...], observations: dict[float, float]) -> Histogram:
    """A cumulative histogram of `observations` (value -> count) over these edges and +Inf."""
    bounds = (*edges, float("inf"))
    buckets = tuple((b, float(sum(n for v, n in observations.items() if v <= b))) for b in bounds)
    return Histogram(buckets=buckets, count=float(sum(observations.values())),
                     sum=float(sum(v * n for v, n in observations.items())))


def _ttft(count: float) -> Histogram:
    return Histogram(buckets=((1.0, count), (float("inf"), count)), count=count, sum=0.1 * count)


# --- expert parallelism: a rank reads its share of the experts --------------------------------------------

def test_an_ep_rank_is_judged_by_the_experts_it_holds() -> None:
    # DeepSeek-V3 (config.json: 61 layers, 3 dense, 256 routed experts of 2,048 top-8 + 1 shared, hidden 7,168,
    # vocab 129,280, fp8 block-quantized linear weights) on H200s at --tp 1 --ep 8 (data-parallel 8): each
    # rank holds 1/8 of the routed experts, and a step's 32 tokens on each of 8 ranks reach every rank's share:
    # touched 1 - (1 - 8/256)^512 = 1.0 at 64 tokens a rank. 24 running of 2,000 tokens (61 x 2,000
    # layer-tokens of 576 x 2 B of MLA latent each) at 24% of 200,000 pool tokens: the first wall is the batch
    # cap of 64, where a step reads
    #   weights: W - routed experts - the input table + a row a token + experts / 8 x 1.0 = 99.0 GB
    #   KV: 64 x 2,000 x 61 x 1,152 B = 9.0 GB;  / (4.8e12 x 0.7) = 32.1 ms -> 1,990 tok/s a rank
    # where every expert counted (the copy's 64 tokens touching 0.87 of all 256) said 586 GB, 178 ms, 360.
    m = preset("deepseek-v3")
    c = TargetConstants(model=m, gpu=H200, gpu_source="flag", tensor_parallel_size=1, expert_parallel_size=8)
    experts, table = m.expert_weight_bytes, 2 * 129_280 * 7168
    weights = m.weight_bytes - experts - table + 64 * 7168 * 2 + experts / 8 * (1 - (1 - 8 / 256) ** 512)
    step = (weights + 64 * 2000 * 61 * 1152) / (4.8e12 * 0.7)
    assert round(weights / 1e9, 1) == 99.0 and round(step * 1e3, 1) == 32.1
    w = WindowValues(window="10s", seconds=10.0, requests_per_second=640 / 500,
                     tokens_per_second={"prefill": 0.0, "decode": 640.0}, mean_running=24.0,
                     mean_kv_usage=0.24, mean_live_kv_bytes=24 * 2000 * 61 * 1152)
    s = hr.window_signals(w, c, 64, 200_000, hr.SignalSettings(role="decode"))
    assert s.capacity is not None and (s.capacity.batch, s.capacity.wall) == (64, "batch")
    assert s.capacity.phase_tokens_per_second["decode"] == pytest.approx(64 / step)
    assert round(s.capacity.phase_tokens_per_second["decode"], -1) == 1990
    # decoding 640 tok/s takes 32% of the rank's time, nowhere near its wall (0 and saturation 1.0 before:
    # 640 x 178 ms / 64 = 1.8 walls); the batch binds, 24 of 64
    assert s.headroom["decode_bandwidth"] == pytest.approx(1 - 640 * step / 64)
    assert round(s.headroom["decode_bandwidth"], 2) == 0.68
    assert (s.saturation, s.binding) == (pytest.approx(24 / 64), "batch")


# --- prefix-cache hits: no prefill work in capacity or the cost split --------------------------------------

def _hit_windows() -> tuple[WindowValues, WindowValues]:
    """10 req/s of 2,000-token prompts, 75% found in the prefix cache, and 250 output tokens, over 10 s, as
    vLLM's by-source counter (5,000 computed prompt tok/s) and its older counter (20,000, hits included) say."""
    c = TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag")
    common = dict(running=20.0, kv_usage_ratio=0.0425, generation_tokens_total=25_000.0, steps_total=400.0,
                  prefix_cache_queries_total=200_000.0, prefix_cache_hits_total=150_000.0, ttft=_ttft(100))
    start = dict(running=20.0, kv_usage_ratio=0.0425, prefix_cache_queries_total=0.0, prefix_cache_hits_total=0.0,
                 ttft=_ttft(0))
    by_source = _window(_series(**start), _series(prompt_tokens_total=50_000.0, **common), c, 1e6)
    older = _window(_series(prompt_tokens_include_cache_hits=True, **start),
                    _series(prompt_tokens_total=200_000.0, prompt_tokens_include_cache_hits=True, **common), c, 1e6)
    return by_source, older


def test_prefix_hits_cost_no_prefill_in_capacity_whatever_the_counter() -> None:
    # A request: 500 computed prompt tokens x 2 x 6,979,588,096 + its LM head once (2 x 525,336,576) at
    # 989e12 x 0.5 = 14.12 ms; 250 decode tokens at the batch cap of 256 sequences of 2,125 tokens:
    # step = (16,060,522,496 - 1,050,673,152 + 256 rows of 8,192 B + 256 x 2,125 x 131,072) / (3.35e12 x 0.7)
    # = 36.8 ms, 250 x 36.8 ms / 256 = 35.9 ms. 1 / 50.1 ms = 20.0 req/s with either counter; counting the
    # hits as prefill work (2,000 tokens a request) read 9.9 with the older one (19.0 with the by-source one,
    # every weight read and multiplied).
    by_source, older = _hit_windows()
    prefill = (500 * 2 * PROMPT_8B + 2 * TABLE_8B) / (989e12 * 0.5)
    step = (16_060_522_496 - 2 * TABLE_8B + 256 * 8192 + 256 * 2125 * 131_072) / (3.35e12 * 0.7)
    expected = 1 / (prefill + 250 * step / 256)
    for w in (by_source, older):
        cap = hr.capacity(w, TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag"), 256,
                          1e6, hr.SignalSettings())
        assert cap is not None and cap.requests_per_second == pytest.approx(expected)
    assert round(expected, 1) == 20.0
    assert by_source.computed_prefill_tokens_per_second == older.computed_prefill_tokens_per_second == 5000.0


def test_prefix_hits_cost_no_gpu_time_in_the_cost_split() -> None:
    # The GPU time of a second: prefill (5,000 x 2 x 6,979,588,096 + 10 x 2 x 525,336,576) / 494.5e12 =
    # 0.1412 s; decode 2,500 tok/s x step(20) / 20, step(20) = (15,009,849,344 + 20 rows + 20 x 2,125 x
    # 131,072) / 2.345e12 = 8.78 ms: 1.097 s. Prefill's share 0.114 with either counter (0.36 when the older
    # counter's 20,000 tok/s were charged 2 x 8.03e9 each).
    by_source, older = _hit_windows()
    c = TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag")
    prefill = (5000 * 2 * PROMPT_8B + 10 * 2 * TABLE_8B) / (989e12 * 0.5)
    step = (16_060_522_496 - 2 * TABLE_8B + 20 * 8192 + 20 * 2125 * 131_072) / (3.35e12 * 0.7)
    decode = 2500 * step / 20
    for w in (by_source, older):
        share = hr.gpu_time_share(w, c, hr.SignalSettings())
        assert share["prefill"] == pytest.approx(prefill / (prefill + decode))
    assert round(prefill / (prefill + decode), 3) == 0.114


# --- a draft model: k passes a step ---------------------------------------------------------------------

def test_a_draft_models_passes_join_the_capacity() -> None:
    # Llama-3-8B with a Llama-3.2-1B draft (config.json: 16 layers of 2,048, tied embeddings: 1,235,814,400
    # parameters, 2,471,628,800 B, its table being its LM head), k = 4 drafts a step accepted at 0.7 each:
    # 2.77 tokens a verify step. At the batch cap of 32, 800 tokens each, a step reads
    #   15,009,849,344 + 160 rows of 8,192 B (32 sequences x 5 verified tokens) + 4 x 2,471,628,800 of draft
    #   + 32 x 800 x 131,072 = 28.25e9 B at 2.345e12 B/s = 12.05 ms
    # (its FLOPs, 160 x (2 x 7,504,924,672 + 16,384 x 800 x 32), take 4.99 ms at 494.5e12): 32 x 2.77 /
    # 12.04 ms = 7,370 decode tok/s; without the draft's bytes 7.82 ms, 11,330.
    draft = preset("llama-3.2-1b")
    assert draft.params_total == 1_235_814_400 and draft.weight_bytes == 2_471_628_800
    c = TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag", draft=draft)
    tau = 1 + 0.7 + 0.49 + 0.343 + 0.2401
    w = WindowValues(window="10s", seconds=10.0, requests_per_second=10.0,
                     tokens_per_second={"prefill": 6000.0, "decode": 2500.0}, mean_running=20.0,
                     mean_kv_usage=0.16, mean_live_kv_bytes=20 * 800 * 131_072, spec_decode_tokens_per_step=tau,
                     spec_decode_draft_length=4.0)
    memory = (16_060_522_496 - 2 * TABLE_8B + 160 * 8192 + 4 * 2_471_628_800 + 32 * 800 * 131_072) / (3.35e12 * 0.7)
    cap = hr.capacity(w, c, 32, 100_000, hr.SignalSettings())
    assert cap is not None and cap.phase_tokens_per_second["decode"] == pytest.approx(32 * tau / memory)
    assert round(cap.phase_tokens_per_second["decode"], -1) == 7370
    alone = hr.capacity(w, TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag"), 32, 100_000,
                        hr.SignalSettings())
    assert round(alone.phase_tokens_per_second["decode"], -1) == 11_330


# --- vLLM's hybrid KV pool: a pool token holds one group's layers -------------------------------------------

def test_gemma_3_capacity_reads_the_cache_its_own_pool_holds() -> None:
    # Gemma-3-27B (text_config: 62 layers, 16 KV heads of 128, bf16; every 6th layer global, the rest a 1,024
    # window): vLLM's hybrid pool pages it in groups of 10 layers, so a pool token holds 10 x 8,192 B. 14
    # running at 50% of 100,000 pool tokens hold 0.5 x 100,000 x 10 / 14 = 35,714 layer-tokens each, 292.6 MB
    # (the all-layer count said 3,571 tokens x 62 layers, 1.81 GB). The KV wall: 14 / 0.5 = 28 sequences,
    # step(28) = (54,018,692,608 + 28 x 292.6e6) / (3.35e12 x 0.7) = 26.5 ms: 1,055 decode tok/s, not 627.
    from rooflight.agent.model_files import load_config_json
    from support import MODEL_CONFIGS

    m = load_config_json(MODEL_CONFIGS / "gemma-3-27b-it.json")
    c = TargetConstants(model=m, gpu=H100, gpu_source="flag", kv_pool_grouped=True)
    per_seq = 0.5 * 100_000 * 10 / 14 * 8192
    w = WindowValues(window="10s", seconds=10.0, requests_per_second=1.0,
                     tokens_per_second={"prefill": 1000.0, "decode": 500.0}, mean_running=14.0, mean_kv_usage=0.5,
                     mean_live_kv_bytes=14 * per_seq)
    step = (54_018_692_608 + 28 * per_seq) / (3.35e12 * 0.7)
    cap = hr.capacity(w, c, 256, 100_000, hr.SignalSettings())
    assert cap is not None and (cap.batch, cap.wall) == (28.0, "kv")
    assert cap.phase_tokens_per_second["decode"] == pytest.approx(28 / step)
    assert round(cap.phase_tokens_per_second["decode"]) == 1055


# --- MoE coverage step by step, from vLLM's iteration_tokens buckets ----------------------------------------

def test_moe_coverage_is_read_step_by_step_from_the_step_histogram() -> None:
    # Qwen3-30B-A3B (config.json: 48 layers, 128 experts of 768, top-8, hidden 2,048, vocab 151,936 untied),
    # 10 s of 8 decodes a step, 50 steps a second, one of them a second also running a 2,040-token prompt:
    # 490 steps of 8 tokens (the le=8 bucket) and 10 of 2,048 (le=2048). A step of T tokens reads
    #   W - routed experts - the input table + T rows of 4,096 B + experts x (1 - (15/16)^T)
    # with experts 48 x 128 x 3 x 2,048 x 768 x 2 B = 57.98 GB: 0.98 x W(8) + 0.02 x W(2,048) = 26.5 GB a step,
    # MBU x 50 / 3.35e12 = 0.40; the mean, 48.8 tokens a step, said 58.0 GB and 0.87 (coverage is concave).
    m = preset("qwen3-30b-a3b")
    c = TargetConstants(model=m, gpu=H100, gpu_source="flag")
    experts, table = m.expert_weight_bytes, 2 * 151_936 * 2048
    assert experts == 48 * 128 * 3 * 2048 * 768 * 2

    def weights(t: float) -> float:
        return m.weight_bytes - experts - table + t * 4096 + experts * (1 - (15 / 16) ** t)

    steps = _histogram(ITERATION_TOKENS_EDGES, {8.0: 490, 2048.0: 10})
    start = _series(step_tokens=_histogram(ITERATION_TOKENS_EDGES, {}), extra={"iteration_tokens_sum": 0.0})
    end = _series(steps_total=500.0, generation_tokens_total=4000.0, prompt_tokens_total=20_400.0,
                  step_tokens=steps, extra={"iteration_tokens_sum": steps.sum})
    w = _window(start, end, c, capacity=None)  # no KV term: the weights alone
    assert w.mbu is None  # (MBU needs the live KV; the bytes it would stream are the step model's)
    w = _window(start, end, c)
    per_step = 0.98 * weights(8) + 0.02 * weights(2048)
    assert w.streamed_bytes_per_second == pytest.approx(per_step * 50)
    assert round(per_step / 1e9, 1) == 26.5 and round(w.mbu, 2) == 0.40
    assert round(weights(24_400 / 500) * 50 / 3.35e12, 2) == 0.87  # the mean's count


# --- attention over the spread of prompt lengths: E[L^2], not E[L]^2 ---------------------------------------

def test_prefill_attention_follows_the_spread_of_prompt_lengths() -> None:
    # Llama-3-8B, 100 requests in 10 s: 90 of 1,000 tokens and 10 of 50,000 (vLLM's prompt-length buckets
    # le=1000 and le=50000, 1-2-5 up to 131,072). A computed token's attention is the prompts' causal
    # triangles over their tokens: 16,384 x 32 x (90 x 1,000 x 1,001 / 2 + 10 x 50,000 x 50,001 / 2) /
    # 590,000 = 1.115e10 FLOPs, where the mean prompt (5,900) gave 16,384 x 32 x 5,901 / 2 = 1.547e9.
    # MFU = (59,000 x (2 x 6,979,588,096 + 1.115e10) + 10 x 2 x 525,336,576) / 989e12 = 1.497 with the spread;
    # held under MAX_UTILIZATION? no: so half the traffic: 29,500 tok/s, 0.749 (the mean said 0.463, 1.6x low).
    c = TargetConstants(model=preset("llama-3-8b"), gpu=H100, gpu_source="flag")
    edges = request_token_edges(131_072)
    start = _series(prompt_length=_histogram(edges, {}), ttft=_ttft(0))
    end = _series(prompt_tokens_total=295_000.0, steps_total=1000.0, ttft=_ttft(50),
                  prompt_length=_histogram(edges, {1000.0: 45, 50_000.0: 5}))
    w = _window(start, end, c)
    attention = PAIR_8B * 32 * (45 * 1000 * 1001 / 2 + 5 * 50_000 * 50_001 / 2) / 295_000
    assert round(attention / 1e10, 3) == 1.115
    assert w.mfu["prefill"] == pytest.approx((29_500 * (2 * PROMPT_8B + attention) + 5 * 2 * TABLE_8B) / 989e12)
    assert round(w.mfu["prefill"], 3) == 0.749
    mean = PAIR_8B * 32 * 5901 / 2
    assert round((29_500 * (2 * PROMPT_8B + mean) + 5 * 2 * TABLE_8B) / 989e12, 3) == 0.463
