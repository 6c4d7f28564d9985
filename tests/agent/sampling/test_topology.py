"""What an engine is, from where it runs: its tensor-parallel size with data parallelism, the GPUs its
sidecar exports, the link from a target to its GPUs, and a GPU with no constants on file.

A fake NVML (collectors/nvml_fake.py) names the GPUs and the PIDs on each; real child processes of
this test stand in for a vLLM's engine-core processes, so the sampler matches them through the
engine's process tree as it would on a node. The agent is driven by hand on a FakeClock: one NVML
sample, one process sample, then two engine pages 10 s apart, so every rate is exact.

The expected numbers are computed here from the page's own counters and published constants
(docs/physics.md, sections MBU and MFU; docs/metrics.md, section Targets, pods and GPUs).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import AsyncIterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.cli import build_parser, load_config
from rooflight.agent.errors import ConfigError
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.roofline.gpus import unknown_gpu_reason
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import AgentConfig, build
from rooflight.agent.sampling.sampler import Agent
from rooflight.collectors.nvml import NvmlCollector
from rooflight.collectors.nvml_fake import MIB, FakeGpu, FakeNvml, h100_like
from rooflight.collectors.process import ProcessCollector
from support import FakeEngine, started_agent, synthetic_page

VLLM_DP_PAGE = synthetic_page("vllm-dp2-tp1")
SECONDS = 10.0
GROWTH = 10  # the second page: every counter grown by a tenth of itself over SECONDS

# Published constants, written here rather than read from the agent's tables.
H100_BANDWIDTH, H100_BF16 = 3.35e12, 989e12  # one H100 SXM: HBM bytes/s, dense bf16 FLOP/s
A10_BF16 = 125e12  # one A10, dense bf16 FLOP/s
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_8B_WEIGHT_BYTES = 2 * LLAMA3_8B_PARAMS  # bf16
LLAMA3_8B_EMBEDDING = 128_256 * 4_096  # the untied input table: a row a token read, no matmul
LLAMA3_8B_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
LLAMA3_8B_ATTENTION = 2 * 32 * (128 + 128)  # FLOPs a query token spends on one cached token in one layer

# vllm-dp2-tp1.prom, per `engine` (DP rank): running, KV occupancy, KV capacity in tokens, engine steps,
# generated tokens and computed (not cached) prompt tokens on the first page.
RANKS = {
    "0": {"kv": 0.25, "capacity": 320_000, "steps": 5000, "decode": 120_000, "prefill": 30_000, "running": 24,
          "step_tokens": 160_000},
    "1": {"kv": 0.1, "capacity": 320_000, "steps": 4000, "decode": 32_000, "prefill": 8_000, "running": 8,
          "step_tokens": 40_000},
}


def grown(page: str) -> str:
    """`page` SECONDS later: every counter and histogram sample plus a tenth of itself, gauges untouched."""
    out = []
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if line.startswith("#") or not name.endswith(("_total", "_bucket", "_count", "_sum")):
            out.append(line)
            continue
        head, value = line.rsplit(" ", 1)
        out.append(f"{head} {float(value) * (1 + 1 / GROWTH)!r}")
    return "\n".join(out) + "\n"


def expected_mbu(rank: str, tp: int) -> float:
    """(weights a step reads + live KV) x steps/s / (HBM peak x TP): docs/physics.md, section MBU; a step
    reads the input table's rows of its tokens (iteration tokens / steps), not the whole table."""
    r = RANKS[rank]
    live_kv = r["kv"] * r["capacity"] * LLAMA3_8B_KV_BYTES_PER_TOKEN
    steps = r["steps"] / GROWTH / SECONDS
    weights = LLAMA3_8B_WEIGHT_BYTES - 2 * LLAMA3_8B_EMBEDDING + r["step_tokens"] / r["steps"] * 4_096 * 2
    return (weights + live_kv) * steps / (H100_BANDWIDTH * tp)


def expected_mfu(rank: str, phase: str, tp: int, peak: float = H100_BF16) -> float:
    """tokens/s x (2 x params multiplied + attention) / (dense peak x TP): docs/physics.md, sections MFU and
    Live ratios. The page has no prompt lengths (no prefill attention) and no TTFT (no prefills seen to run
    the LM head, which a prompt token skips); a decode token attends to its sequence's cache: KV occupancy x
    capacity / running tokens in each of 32 layers."""
    r = RANKS[rank]
    tokens = r[phase] / GROWTH / SECONDS
    attention = LLAMA3_8B_ATTENTION * 32 * r["kv"] * r["capacity"] / r["running"] if phase == "decode" else 0.0
    lm_head = LLAMA3_8B_EMBEDDING if phase == "prefill" else 0  # the same 128,256 x 4,096 shape
    return tokens * (2 * (LLAMA3_8B_PARAMS - LLAMA3_8B_EMBEDDING - lm_head) + attention) / (peak * tp)


Metrics = list[tuple[str, dict[str, str], float]]


def exposition(agent: Agent) -> Metrics:
    text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def values(metrics: Metrics, name: str, **labels: str) -> list[float]:
    return [v for n, lbl, v in metrics if n == name and labels.items() <= lbl.items()]


def labelsets(metrics: Metrics, name: str) -> list[dict[str, str]]:
    return [lbl for n, lbl, _ in metrics if n == name]


@asynccontextmanager
async def children(count: int) -> AsyncIterator[list[int]]:
    """`count` child processes of this test: in its process tree, as a vLLM's engine cores are in the API server's."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _config(url: str, **settings: object) -> AgentConfig:
    return build({}, {}, {"engine_url": [url], "model": "llama-3-8b", "interval": "1s", "windows": "10s",
                          **settings})


async def sample(agent: Agent, engine: FakeEngine, clock: FakeClock, nvml: FakeNvml, page: str) -> None:
    """NVML, the engine's process tree (rooted at this test), then the engine's page now and SECONDS later."""
    collector = NvmlCollector(lib=nvml, clock=clock.monotonic)
    try:
        await agent.sample_gpus_once(collector)
        (target,) = agent.config.targets
        await agent.sample_process_once(target, ProcessCollector(pid=os.getpid()))
        engine.body = page
        await agent.sample_engines_once()
        clock.advance(SECONDS)
        engine.body = grown(page)
        await agent.sample_engines_once()
    finally:
        collector.close()


def node(engine_pids: list[int]) -> FakeNvml:
    """Three H100s: the engine's processes on the first ones, another tenant's (our parent) on the last."""
    nvml = h100_like(len(engine_pids) + 1)
    for gpu, pid in zip(nvml.gpus, [*engine_pids, os.getppid()]):
        gpu.processes = [(pid, 60_000 * MIB)]
    return nvml


async def test_vllm_data_parallel_ranks_are_tp1_each_over_its_own_gpu(fake_engine: FakeEngine) -> None:
    """vLLM --data-parallel-size 2 at TP 1 on two GPUs: NVML shows two GPUs under the engine, its page two
    `engine` ranks, so one model copy spans 2 / 2 = 1 GPU and each rank's MBU and MFU are over one GPU's
    peaks (counting both GPUs halved every rank's)."""
    clock = FakeClock()
    async with children(2) as pids:
        nvml = node(pids)
        async with started_agent(_config(fake_engine.url), loops=False, clock=clock, nvml_lib=nvml) as agent:
            await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
            (target,) = agent.snapshot.targets
            m = exposition(agent)
    assert target.constants.tensor_parallel_size == 1
    assert values(m, "rooflight_tensor_parallel_size") == [1.0]
    for rank in RANKS:
        series = {"rank": rank, "window": "10s"}
        assert values(m, "rooflight_mbu_ratio", **series) == [pytest.approx(expected_mbu(rank, tp=1), rel=1e-9)]
        for phase in ("decode", "prefill"):
            got = values(m, "rooflight_mfu_ratio", phase=phase, **series)
            assert got == [pytest.approx(expected_mfu(rank, phase, tp=1), rel=1e-9)]
    # rank 0 by hand: (16.06 GB - 1.05 GB of input table + 32 rows of 8 KiB + 0.25 x 320,000 x 131,072 B)
    # x 50 steps/s / 3.35 TB/s
    assert expected_mbu("0", tp=1) == pytest.approx(
        (16_060_522_496 - 1_050_673_152 + 262_144 + 10_485_760_000) * 50 / 3.35e12, rel=1e-12)


async def test_a_sidecar_exports_its_engines_gpus_and_links_them_to_its_target(fake_engine: FakeEngine) -> None:
    clock = FakeClock()
    async with children(2) as pids:
        nvml = node(pids)
        async with started_agent(_config(fake_engine.url), loops=False, clock=clock, nvml_lib=nvml) as agent:
            await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
            (target,) = agent.config.targets
            m = exposition(agent)
    own = [("0", "GPU-h100-0000"), ("1", "GPU-h100-0001")]
    assert sorted((lbl["gpu"], lbl["uuid"]) for lbl in labelsets(m, "rooflight_gpu_info")) == own
    assert sorted({lbl["uuid"] for lbl in labelsets(m, "rooflight_gpu_memory_used_bytes")}) == [u for _, u in own]
    links = sorted((lbl["target"], lbl["gpu"], lbl["uuid"], lbl["rule"])
                   for lbl in labelsets(m, "rooflight_target_gpu_info"))
    assert links == [(target.name, gpu, uuid, "nvml_pids") for gpu, uuid in own]


async def test_gpus_all_exports_every_gpu_on_the_node(fake_engine: FakeEngine) -> None:
    """A node-level agent (`gpus: all`) exports the other tenant's GPU too; the link still names the target's."""
    clock = FakeClock()
    async with children(2) as pids:
        nvml = node(pids)
        config = _config(fake_engine.url, gpus="all")
        async with started_agent(config, loops=False, clock=clock, nvml_lib=nvml) as agent:
            await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
            m = exposition(agent)
    assert sorted(lbl["gpu"] for lbl in labelsets(m, "rooflight_gpu_info")) == ["0", "1", "2"]
    assert sorted(lbl["gpu"] for lbl in labelsets(m, "rooflight_target_gpu_info")) == ["0", "1"]


async def test_no_engine_pid_on_a_gpu_keeps_the_fallback_and_says_so(fake_engine: FakeEngine) -> None:
    """NVML shows other PIDs only (a PID namespace, say): every visible GPU, rule all_visible, and no TP
    guessed from them."""
    clock = FakeClock()
    nvml = h100_like(2)
    for gpu in nvml.gpus:
        gpu.processes = [(os.getppid(), 60_000 * MIB)]
    async with started_agent(_config(fake_engine.url), loops=False, clock=clock, nvml_lib=nvml) as agent:
        await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
        (target,) = agent.snapshot.targets
        m = exposition(agent)
    assert sorted(lbl["gpu"] for lbl in labelsets(m, "rooflight_gpu_info")) == ["0", "1"]
    assert {lbl["rule"] for lbl in labelsets(m, "rooflight_target_gpu_info")} == {"all_visible"}
    assert len(labelsets(m, "rooflight_target_gpu_info")) == 2
    assert target.constants.tensor_parallel_size == 1


async def test_the_engine_says_tp_before_the_flag_and_nvml(fake_engine: FakeEngine) -> None:
    """trtllm-serve's page says TP 2 (parallel_config_info): it wins over a stale --tp 4 and over the one GPU
    NVML shows under the engine."""
    clock = FakeClock()
    async with children(1) as pids:
        nvml = node(pids)
        config = _config(fake_engine.url, tp=4, metrics_path="/metrics")
        async with started_agent(config, loops=False, clock=clock, nvml_lib=nvml) as agent:
            await sample(agent, fake_engine, clock, nvml, synthetic_page("trtllm-serve-2026"))
            (target,) = agent.snapshot.targets
    assert target.constants.tensor_parallel_size == 2


async def test_the_flag_sets_tp_where_the_engine_does_not_say(fake_engine: FakeEngine) -> None:
    clock = FakeClock()
    async with children(2) as pids:
        nvml = node(pids)
        config = _config(fake_engine.url, tp=2)
        async with started_agent(config, loops=False, clock=clock, nvml_lib=nvml) as agent:
            await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
            m = exposition(agent)
    assert values(m, "rooflight_tensor_parallel_size") == [2.0]
    assert values(m, "rooflight_mbu_ratio", rank="0") == [pytest.approx(expected_mbu("0", tp=2), rel=1e-9)]


def a10g() -> FakeNvml:
    """One A10G, the engine (this test's process) on it: NVIDIA publishes no tensor figures for it."""
    gpu = FakeGpu(name="NVIDIA A10G", uuid="GPU-a10g-0000", memory_total=23028 * MIB, memory_used=20000 * MIB,
                  power_mw=200_000, energy_mj=1_000_000, processes=[(os.getpid(), 20_000 * MIB)])
    return FakeNvml([gpu])


async def test_an_unknown_gpu_leaves_mbu_and_mfu_absent_and_says_why(
    fake_engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    nvml = a10g()
    reason = unknown_gpu_reason("NVIDIA A10G")
    caplog.set_level(logging.WARNING, logger="rooflight")
    config = _config(fake_engine.url, batch_max=64)
    async with started_agent(config, loops=False, clock=clock, nvml_lib=nvml) as agent:
        await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
        await agent.sample_engines_once()  # views rebuilt again: the reason is still logged once
        (target,) = agent.snapshot.targets
        m = exposition(agent)
    c = target.constants
    assert (c.gpu, c.gpu_source, c.gpu_note, c.gpu_key) == (None, "nvml", reason, "unknown")
    assert c.peak_bandwidth is None and c.peak_flops is None
    for name in ("rooflight_mbu_ratio", "rooflight_mfu_ratio", "rooflight_mbu_to_dram_bandwidth",
                 "rooflight_gpu_peak_flops", "rooflight_gpu_peak_memory_bandwidth_bytes_per_second",
                 "rooflight_capacity_requests_per_second", "rooflight_capacity_decode_tokens_per_second",
                 "rooflight_capacity_phase_tokens_per_second"):
        assert values(m, name) == [], name
    resources = {lbl["resource"] for lbl in labelsets(m, "rooflight_headroom_ratio")}
    assert resources == {"kv", "batch"}  # decode_bandwidth and prefill_compute divide by a peak
    assert values(m, "rooflight_tokens_per_second", rank="0", phase="decode") == [pytest.approx(1200.0)]
    (info,) = labelsets(m, "rooflight_gpu_info")
    assert (info["name"], info["profile"], info["reason"]) == ("NVIDIA A10G", "unknown", reason)
    logged = [r for r in caplog.records if "A10G" in r.getMessage()]
    assert len(logged) == 1 and reason in logged[0].getMessage()


async def test_a_flag_gives_an_unknown_gpu_its_constants(fake_engine: FakeEngine) -> None:
    """`--gpu a10` where the operator knows the figures match: the target has them; the GPU's own row
    still says its name matched no profile."""
    clock = FakeClock()
    nvml = a10g()
    async with started_agent(_config(fake_engine.url, gpu="a10"), loops=False, clock=clock, nvml_lib=nvml) as agent:
        await sample(agent, fake_engine, clock, nvml, VLLM_DP_PAGE)
        (target,) = agent.snapshot.targets
        m = exposition(agent)
    assert (target.constants.gpu.key, target.constants.gpu_source) == ("a10", "flag")
    got = values(m, "rooflight_mfu_ratio", rank="0", phase="decode", window="10s")
    assert got == [pytest.approx(expected_mfu("0", "decode", tp=1, peak=A10_BF16), rel=1e-9)]
    (info,) = labelsets(m, "rooflight_gpu_info")
    assert info["profile"] == "unknown"


def test_gpus_setting_own_by_default_all_by_flag_environment_or_file() -> None:
    url = "http://127.0.0.1:8000"
    assert build({}, {}, {"engine_url": [url]}).gpus == "own"
    assert build({"gpus": "all"}, {}, {"engine_url": [url]}).gpus == "all"
    args = build_parser().parse_args(["run", "--engine-url", url, "--gpus", "all"])
    assert load_config(args, environ={}).gpus == "all"
    plain = build_parser().parse_args(["run", "--engine-url", url])
    assert load_config(plain, environ={"ROOFLIGHT_GPUS": "all"}).gpus == "all"
    with pytest.raises(ConfigError, match="gpus"):
        build({}, {}, {"engine_url": [url], "gpus": "some"})
