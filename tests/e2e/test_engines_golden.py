"""Golden agent /metrics per engine: a FakeEngine serves one engine's page, then the same page 10 s of
load later (every counter and histogram grown by a tenth: `grown`), the agent (auto-detecting, FakeClock)
samples both, and what it serves is compared byte for byte. So every rate, MBU and MFU an engine's
page can give is non-zero in its golden, and the numbers that carry the physics are also checked
against values computed by hand here, from each page's own numbers and the models' published shapes:
TRT-LLM at TP 2 (MFU over both GPUs' peak), Mixtral at TP 2 on vLLM (MBU with the experts a batch of
16 touches), and an SGLang with two DP ranks (each rank its own rates and MFU).

The tests only compare; `python tests/regen_goldens.py` rewrites the goldens (read the diff). The
hand-written checks run before the comparison, so a regenerated golden cannot carry a number that
contradicts them. Each file must also pass `promtool check metrics`.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.metrics.exposition import registry_for
from rooflight.collectors import coverage
from support import GOLDEN, FakeEngine, check_golden, promtool_clean, sample_text, started_agent, synthetic_page

TGI_PAGE, TRTLLM_PAGE = synthetic_page("tgi-3x"), synthetic_page("trtllm-serve-2026")
DYNAMO_FRONTEND_PAGE, SGLANG_DP_PAGE = synthetic_page("dynamo-frontend"), synthetic_page("sglang-dp2-tp2-pids")

GOLDEN = GOLDEN / "engines"

PAGES = {
    "sglang": sample_text("sglang-docs-llama31-8b-under-load.prom"),
    "tgi": TGI_PAGE,
    "trtllm": TRTLLM_PAGE,
    "triton": sample_text("triton-trtllm-backend-ifb-readme.prom"),
    "llamacpp": sample_text("llamacpp-server-cpu-load-c8.prom"),
    "dynamo": sample_text("dynamo-sglang-worker-1req.prom"),
    "dynamo-frontend": DYNAMO_FRONTEND_PAGE,
}

VLLM_PAGE = sample_text("vllm-cpu-load-c16.prom")
SECONDS = 10.0  # between the two pages
GROWTH = 10  # the second page: every counter and histogram count/sum grown by 1/GROWTH of itself ...
SLOW_GROWTH = {"sglang": 1000}  # ... or less, for a page of a long run (SGLang's: 8.1M prompt tokens)
# A cumulative number an engine types as a gauge, which `grown` leaves alone: (first page, second page).
GAUGE_COUNTERS = {
    "triton": ('nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 0',
               'nv_trt_llm_general_metrics{general_type="iteration_counter",model="tensorrt_llm",version="1"} 300'),
}

# Published constants, written here rather than read from the agent's tables.
H100_BANDWIDTH, H100_BF16 = 3.35e12, 989e12  # bytes/s and dense FLOP/s of one H100 SXM
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_8B_TABLE = 128_256 * 4_096  # the untied input embedding table: a lookup, not multiplied nor streamed
ATTENTION_PAIR = 2 * 32 * (128 + 128)  # FLOPs of one query token on one cached token, one layer (32 heads of 128)
# Mixtral-8x7B (config.json: 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, 8 experts of
# intermediate 14336, top-2, vocab 32000, untied embeddings), bf16:
MIXTRAL_EXPERT_PARAMS = 32 * 8 * 3 * 4096 * 14336  # 45,097,156,608: every layer's gate/up/down per expert
MIXTRAL_SHARED_PARAMS = (2 * 32000 * 4096  # embeddings and LM head
                         + 32 * (4096 * (4096 + 1024 + 1024 + 4096)  # q, k, v, o
                                 + 4096 * 8 + 2 * 4096)  # router, two norms
                         + 4096)  # final norm: 1,605,636,096
MIXTRAL_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # 131072


def grown(page: str, by: int = GROWTH) -> str:
    """`page` after more of the same load: every counter, histogram bucket/count/sum and summary
    count/sum plus 1/`by` of itself (`_created` and gauges untouched). Untyped samples count as
    counters when their name says so (_total, _bucket, _count, _sum)."""
    types: dict[str, str] = {}
    out = []
    for line in page.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(None, 3)
            types[name] = kind.strip()
        out.append(line if line.startswith("#") or not line.strip() else _grow_line(line, types, by))
    return "\n".join(out) + "\n"


def _grow_line(line: str, types: dict[str, str], by: int) -> str:
    head, value, tail = _split_sample(line)
    name = head.split("{", 1)[0]
    if not _grows(name, types) or not math.isfinite(float(value)):
        return line
    v = float(value)
    return f"{head} {v + v / by!r}{tail}"


def _grows(name: str, types: dict[str, str]) -> bool:
    if name.endswith("_created"):
        return False
    for suffix in ("", "_total", "_bucket", "_count", "_sum"):
        base = name[: len(name) - len(suffix)] if suffix and name.endswith(suffix) else name
        if (suffix == "" or name.endswith(suffix)) and base in types:
            kind = types[base]
            return kind in ("counter", "histogram") or (kind == "summary" and suffix in ("_count", "_sum"))
    return name.endswith(("_total", "_bucket", "_count", "_sum"))


def _split_sample(line: str) -> tuple[str, str, str]:
    """(name and labels, value, ' timestamp' or ''), quotes in label values respected."""
    name_end = len(line.split(None, 1)[0])
    head_end = name_end
    if "{" in line[:name_end]:
        quoted = escaped = False
        for i in range(line.index("{"), len(line)):
            c = line[i]
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                quoted = not quoted
            elif c == "}" and not quoted:
                head_end = i + 1
                break
    rest = line[head_end:].split()
    return line[:head_end], rest[0], "".join(" " + r for r in rest[1:])


def _config(urls: list[str], **per_target: dict[str, object]) -> AgentConfig:
    # metrics_path: trtllm-serve's real path is /prometheus/metrics; the FakeEngine serves /metrics.
    settings = {"nvml": False, "process": False, "interval": "1s", "windows": "10s,1m",
                "model": "llama-3-8b", "gpu": "h100-sxm", "metrics_path": "/metrics",
                "targets": [{"url": url, **per_target.get(str(i), {})} for i, url in enumerate(urls)]}
    return build({}, {}, settings)


def second_page(engine: str, page: str) -> str:
    """The page SECONDS later: grown, and any gauge-typed counter advanced."""
    later = grown(page, SLOW_GROWTH.get(engine, GROWTH))
    if engine in GAUGE_COUNTERS:
        before, after = GAUGE_COUNTERS[engine]
        assert before in later
        later = later.replace(before, after)
    return later


async def _observe(engines: list[FakeEngine], pages: list[tuple[str, str]], config: AgentConfig) -> str:
    """Sample every engine on its first page, then SECONDS later on its second; the agent's /metrics."""
    clock = FakeClock()
    async with started_agent(config, loops=False, clock=clock, nvml_lib=None) as agent:
        for engine, (first, _) in zip(engines, pages):
            engine.body = first
        await agent.sample_engines_once()
        clock.advance(SECONDS)
        for engine, (_, second) in zip(engines, pages):
            engine.body = second
        await agent.sample_engines_once()
        text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
        for i, target in enumerate(agent.config.targets):
            text = text.replace(target.name, f"ENGINE{i}")  # the fake engines' ports change per run
    return text


Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _metrics(text: str) -> Metrics:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    """The one sample of `name` with these labels (among others)."""
    found = [v for (n, lbl), v in metrics.items() if n == name and set(labels.items()) <= lbl]
    assert len(found) == 1, (name, labels, found)
    return found[0]


MOVING = ("rooflight_tokens_per_second", "rooflight_steps_per_second", "rooflight_mbu_ratio", "rooflight_mfu_ratio")
# What each engine's page can give (docs/engines.md coverage): all of it must be there, and moving.
DERIVED = {
    "sglang": {"rooflight_tokens_per_second", "rooflight_mfu_ratio"},
    "tgi": {"rooflight_tokens_per_second", "rooflight_steps_per_second", "rooflight_mfu_ratio"},
    "trtllm": {"rooflight_tokens_per_second", "rooflight_mfu_ratio"},
    "triton": {"rooflight_steps_per_second", "rooflight_mbu_ratio"},
    "llamacpp": {"rooflight_tokens_per_second", "rooflight_steps_per_second", "rooflight_mfu_ratio"},
    "dynamo": set(MOVING),
    "dynamo-frontend": {"rooflight_tokens_per_second", "rooflight_mfu_ratio"},
}


def _assert_moving(metrics: Metrics, expected: set[str]) -> None:
    present = {n for (n, _) in metrics if n in MOVING}
    assert expected <= present, f"missing {sorted(expected - present)}"
    still = sorted((n, dict(lbl)) for (n, lbl), v in metrics.items() if n in MOVING and not v > 0)
    assert not still, f"derived numbers that do not move: {still}"


def _check_trtllm_tp2(m: Metrics) -> None:
    """trtllm-serve-2026.prom at TP 2: prompt 52000 (12000 cached), generation 81000, 12 running, KV
    0.625 of 4096 blocks x 32 tokens in fp8, spec decode 2600 of 4000 accepted, TTFT buckets 200/310/320."""
    series = {"engine": "trtllm", "rank": "0", "window": "10s"}
    assert _value(m, "rooflight_tensor_parallel_size") == 2
    decode = 81000 / GROWTH / SECONDS  # 810 tokens/s
    prefill = (52000 - 12000) / GROWTH / SECONDS  # computed prompt tokens only: 400/s
    assert _value(m, "rooflight_tokens_per_second", phase="decode", **series) == pytest.approx(decode, rel=1e-9)
    assert _value(m, "rooflight_tokens_per_second", phase="prefill", **series) == pytest.approx(prefill, rel=1e-9)
    two_gpus = 2 * H100_BF16  # one model copy spans both GPUs: MFU is over both peaks
    # a decode token attends to its sequence's cache: 0.625 x 4096 x 32 tokens / 12 running, in 32 layers;
    # no prompt lengths on the page, so no prefill attention; a prompt token skips the LM head (the table's
    # shape), run once for each of the 320 / GROWTH first tokens in the window
    context = 0.625 * 4096 * 32 / 12 * 32
    prefills = 320 / GROWTH / SECONDS
    for phase, rate in (("decode", decode), ("prefill", prefill)):
        if phase == "decode":
            flops = rate * (2 * (LLAMA3_8B_PARAMS - LLAMA3_8B_TABLE) + ATTENTION_PAIR * context)
        else:
            flops = rate * 2 * (LLAMA3_8B_PARAMS - 2 * LLAMA3_8B_TABLE) + prefills * 2 * LLAMA3_8B_TABLE
        expected = flops / two_gpus
        assert _value(m, "rooflight_mfu_ratio", phase=phase, **series) == pytest.approx(expected, rel=1e-9)
    # decode intensity: the step model's decode step of the 12 running over the live KV: 12 x (2 x the weights a
    # token multiplies + its attention over its sequence's cache) / (the weights but the input table, of which
    # 12 rows, + the live KV), whole model (fp8 KV: 2 x 32 x 8 x 128 x 1 bytes/token)
    live_kv = 0.625 * 4096 * 32 * (2 * 32 * 8 * 128 * 1)
    flops = 12 * (2 * (LLAMA3_8B_PARAMS - LLAMA3_8B_TABLE) + ATTENTION_PAIR * context)
    intensity = flops / (2 * (LLAMA3_8B_PARAMS - LLAMA3_8B_TABLE) + 12 * 4096 * 2 + live_kv)
    assert _value(m, "rooflight_decode_arithmetic_intensity_flops_per_byte", **series) == pytest.approx(intensity, rel=1e-9)
    assert _value(m, "rooflight_spec_decode_acceptance_ratio", **series) == pytest.approx(2600 / 4000, rel=1e-9)
    # TTFT over the 10 s: 20 of 32 requests under 0.1 s, 31 under 0.5 s (interpolated as Prometheus does)
    ttft = {"50": 16 / 20 * 0.1, "90": 0.1 + (28.8 - 20) / (31 - 20) * 0.4, "99": 0.5}
    for q, expected in ttft.items():
        got = _value(m, "rooflight_ttft_seconds", percentile=q, **series)
        assert got == pytest.approx(expected, rel=1e-9), q


CHECKS = {"trtllm": _check_trtllm_tp2}


@pytest.mark.parametrize("engine", sorted(PAGES))
async def test_golden_engine(fake_engine: FakeEngine, engine: str) -> None:
    page = PAGES[engine]
    text = await _observe([fake_engine], [(page, second_page(engine, page))], _config([fake_engine.url]))
    promtool_clean(text)
    expected = "dynamo" if engine.startswith("dynamo") else engine
    assert f'engine="{expected}"' in text
    assert 'rooflight_source_up{source="engine",target="ENGINE0"} 1.0' in text
    if engine in coverage.ENGINES and engine != "dynamo":  # dynamo's column is the frontend's
        for field, cell in coverage.coverage(engine).items():
            if coverage.is_missing(cell) and field != "tensor_parallel_size":  # TP is also a flag (--tp)
                assert coverage.FIELDS[field] + "{" not in text, f"{engine} cannot say {field}, yet it is exported"
    metrics = _metrics(text)
    assert engine in DERIVED, f"say in DERIVED which derived numbers {engine}'s page can give"
    _assert_moving(metrics, DERIVED[engine])
    CHECKS.get(engine, lambda m: None)(metrics)
    check_golden(GOLDEN / f"{engine}.prom", text)


async def test_one_agent_two_engines_mixtral_tp2_and_dp_ranks(fake_engine: FakeEngine) -> None:
    """A vLLM serving Mixtral-8x7B on two GPUs (--model, --tp) and an SGLang with two DP ranks of TP 2."""
    second = FakeEngine()
    await second.start()
    try:
        config = _config([fake_engine.url, second.url], **{"0": {"model": "mixtral-8x7b", "tp": 2}})
        pages = [(VLLM_PAGE, second_page("vllm", VLLM_PAGE)), (SGLANG_DP_PAGE, second_page("sglang-dp", SGLANG_DP_PAGE))]
        text = await _observe([fake_engine, second], pages, config)
    finally:
        await second.stop()
    promtool_clean(text)
    assert 'rooflight_requests_running{engine="vllm",model="tiny-llama",rank="0",target="ENGINE0"} 16.0' in text
    assert 'rooflight_requests_running{engine="sglang",model="m",rank="0",target="ENGINE1"} 10.0' in text
    assert 'rooflight_requests_running{engine="sglang",model="m",rank="1",target="ENGINE1"} 4.0' in text
    m = _metrics(text)
    _assert_moving(m, set(MOVING))
    _check_mixtral_tp2(m)
    _check_sglang_dp_ranks(m)
    check_golden(GOLDEN / "two-targets-vllm-sglang-dp.prom", text)


def _check_mixtral_tp2(m: Metrics) -> None:
    """vllm-cpu-load-c16.prom: 16 running, 508 engine steps, 8096 generated tokens, KV 0.005860090343059454
    of 1048576 tokens, 9784 tokens in those steps. A step reads the shared weights but the input table (a row
    a token of it), the experts its tokens touch (1 - (1 - 2/8)^T of them under uniform routing), and the live
    KV, against both GPUs' bandwidth. T step by step, from iteration_tokens_total's buckets: 503 steps in
    (8, 16], 2 in (32, 64], 1 in (64, 128], 2 in (512, 1024]; whole token counts, so 9..16, 33..64, 65..128,
    513..1024, each bucket at one fraction f of its range with the points' mean the sum's 9784 / 508:
    f = (9784 - (503 x 9 + 2 x 33 + 65 + 2 x 513)) / (503 x 7 + 2 x 31 + 63 + 2 x 511) = 4100 / 4668."""
    series = {"engine": "vllm", "rank": "0", "window": "10s", "target": "ENGINE0"}
    assert _value(m, "rooflight_tensor_parallel_size", target="ENGINE0") == 2
    steps = 508 / GROWTH / SECONDS
    f = (9784 - (503 * 9 + 2 * 33 + 65 + 2 * 513)) / (503 * 7 + 2 * 31 + 63 + 2 * 511)
    buckets = ((503, 9 + 7 * f), (2, 33 + 31 * f), (1, 65 + 63 * f), (2, 513 + 511 * f))
    assert sum(n * t for n, t in buckets) == pytest.approx(9784)
    table = 32000 * 4096

    def weights(t: float) -> float:
        return 2 * (MIXTRAL_SHARED_PARAMS - table) + t * 4096 * 2 + 2 * MIXTRAL_EXPERT_PARAMS * (1 - (1 - 2 / 8) ** t)

    read = (sum(n * weights(t) for n, t in buckets) / 508
            + 0.005860090343059454 * 1048576 * MIXTRAL_KV_BYTES_PER_TOKEN)
    assert _value(m, "rooflight_steps_per_second", **series) == pytest.approx(steps, rel=1e-9)
    assert _value(m, "rooflight_mbu_ratio", **series) == pytest.approx(read * steps / (2 * H100_BANDWIDTH), rel=1e-9)
    active = MIXTRAL_SHARED_PARAMS + MIXTRAL_EXPERT_PARAMS * 2 / 8  # 12,879,925,248: two of eight experts
    decode = 8096 / GROWTH / SECONDS
    context = 0.005860090343059454 * 1048576 / 16 * 32  # layer-tokens a decode token attends to
    expected_mfu = decode * (2 * (active - table) + ATTENTION_PAIR * context) / (2 * H100_BF16)
    assert _value(m, "rooflight_mfu_ratio", phase="decode", **series) == pytest.approx(expected_mfu, rel=1e-9)


def _check_sglang_dp_ranks(m: Metrics) -> None:
    """sglang-dp2-tp2-pids.prom: rank 0 decoded 5000 tokens and prefilled 900 in 730 passes, rank 1
    decoded 2000 and retracted 6 requests. Each DP rank is its own model copy on its own TP 2 GPUs:
    its own rates, and MFU over its own two GPUs, never the sum of the ranks."""
    assert _value(m, "rooflight_tensor_parallel_size", target="ENGINE1") == 2
    rank0 = {"engine": "sglang", "rank": "0", "window": "10s", "target": "ENGINE1"}
    rank1 = {**rank0, "rank": "1"}
    for series, decode in ((rank0, 5000 / GROWTH / SECONDS), (rank1, 2000 / GROWTH / SECONDS)):
        assert _value(m, "rooflight_tokens_per_second", phase="decode", **series) == pytest.approx(decode, rel=1e-9)
        # no KV occupancy x capacity on this page to size a decode token's attention: the weights' 2P alone
        expected = decode * 2 * (LLAMA3_8B_PARAMS - LLAMA3_8B_TABLE) / (2 * H100_BF16)
        assert _value(m, "rooflight_mfu_ratio", phase="decode", **series) == pytest.approx(expected, rel=1e-9)
    assert _value(m, "rooflight_tokens_per_second", phase="prefill", **rank0) == pytest.approx(900 / GROWTH / SECONDS)
    assert _value(m, "rooflight_steps_per_second", **rank0) == pytest.approx(730 / GROWTH / SECONDS)
    assert _value(m, "rooflight_preemptions_per_second", **rank1) == pytest.approx(6 / GROWTH / SECONDS)


async def test_vllm_pages_a_hybrid_models_kv_by_attention_type_group(fake_engine: FakeEngine) -> None:
    """Gemma-2-9B (21 sliding + 21 full layers) behind vLLM: its hybrid KV-cache manager pages one group of
    21 layers per pool token, so live KV = 0.005860090343059454 x 1,048,576 x 21 x 8,192 B (2 x 8 KV heads
    x 256 x 2 B a layer), half the all-layer count (docs/physics.md, section Live ratios)."""
    config = _config([fake_engine.url], **{"0": {"model": "gemma-2-9b"}})
    text = await _observe([fake_engine], [(VLLM_PAGE, second_page("vllm", VLLM_PAGE))], config)
    live = _value(_metrics(text), "rooflight_kv_cache_live_bytes", engine="vllm")
    assert live == pytest.approx(0.005860090343059454 * 1048576 * 21 * 8192, rel=1e-9)
