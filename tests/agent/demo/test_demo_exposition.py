"""The demo serves vLLM's exact /metrics format (names, labels, bucket edges) over real HTTP."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.demo import DemoConfig, DemoEngine, start_demo_engine

# Families in the recorded vLLM 0.32 page (tests/fixtures/engine-samples/vllm-cpu-load-c16.prom),
# as prometheus_client's parser names them (counters without _total).
REQUIRED = {
    "vllm:estimated_flops_per_gpu": "counter", "vllm:estimated_read_bytes_per_gpu": "counter",
    "vllm:estimated_write_bytes_per_gpu": "counter", "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge", "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:engine_sleep_state": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter", "vllm:prompt_tokens": "counter", "vllm:prompt_tokens_by_source": "counter",
    "vllm:prompt_tokens_cached": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:admission_rejections": "counter", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram", "vllm:iteration_tokens_total": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram", "vllm:request_params_n": "histogram",
    "vllm:request_params_max_tokens": "histogram", "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram", "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram", "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram", "vllm:request_num_preemptions": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram", "vllm:cache_config_info": "gauge",
}
ITL_EDGES = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
             40.0, 80.0, float("inf")]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def busy_engine(scenario: str = "steady", seconds: float = 20) -> DemoEngine:
    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario=scenario), clock)
    for _ in range(int(seconds)):
        clock.advance(1.0)
        engine.tick()
    return engine


def value(fams: dict, name: str, suffix: str = "", **labels: str) -> float:
    for s in fams[name].samples:
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((name, suffix, labels))


def test_every_vllm_family_is_there_with_its_type_and_labels() -> None:
    fams = families(busy_engine().metrics_text())
    for name, kind in REQUIRED.items():
        assert name in fams and fams[name].type == kind, name
    for name in REQUIRED:
        for s in fams[name].samples:
            if name == "vllm:cache_config_info":
                assert s.labels["engine"] == "0" and "model_name" not in s.labels
            elif name == "vllm:admission_rejections":
                assert s.labels["model_name"] == "llama-3-8b" and "engine" not in s.labels
            else:
                assert s.labels["engine"] == "0" and s.labels["model_name"] == "llama-3-8b", s


def test_bucket_edges_are_vllms() -> None:
    fams = families(busy_engine().metrics_text())

    def edges(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in fams[name].samples if s.name.endswith("_bucket")]

    assert edges("vllm:inter_token_latency_seconds") == ITL_EDGES
    assert edges("vllm:iteration_tokens_total")[:3] == [1.0, 8.0, 16.0]
    assert edges("vllm:iteration_tokens_total")[-2:] == [16384.0, float("inf")]
    assert edges("vllm:request_prompt_tokens")[-3:] == [2000.0, 5000.0, float("inf")]  # 1-2-5 up to 8192
    assert edges("vllm:time_to_first_token_seconds")[0] == 0.001
    assert edges("vllm:e2e_request_latency_seconds")[-2:] == [7680.0, float("inf")]


def test_counters_agree_with_each_other_and_the_physics() -> None:
    engine = busy_engine()
    fams = families(engine.metrics_text())
    steps = value(fams, "vllm:iteration_tokens_total", "_count")
    assert steps == engine.sim.tally.steps > 1000
    prompt = value(fams, "vllm:prompt_tokens", "_total")
    gen = value(fams, "vllm:generation_tokens", "_total")
    assert value(fams, "vllm:iteration_tokens_total", "_sum") == pytest.approx(prompt + gen)
    assert value(fams, "vllm:prompt_tokens_by_source", "_total", source="local_compute") == prompt
    flops = value(fams, "vllm:estimated_flops_per_gpu", "_total")
    # the step model's FLOPs: a prompt token 2 x 6,979,588,096 (not the input table, not the LM head), a
    # generated one 2 x 7,504,924,672 (not the input table), each plus its attention: a few % more
    matmuls = 2 * 6_979_588_096 * prompt + 2 * 7_504_924_672 * gen
    assert matmuls < flops < 1.05 * matmuls
    buckets = [s.value for s in fams["vllm:inter_token_latency_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == value(fams, "vllm:inter_token_latency_seconds", "_count")


def test_cache_config_info_describes_the_kv_pool() -> None:
    engine = busy_engine("kv-wall", 60)
    fams = families(engine.metrics_text())
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and info["cache_dtype"] == "auto"
    assert int(info["kv_cache_size_tokens"]) == int(info["num_gpu_blocks"]) * 16 == engine.plant.kv_capacity_tokens
    assert info["gpu_memory_utilization"] == "0.9"
    # 72 GB budget - 16 GB weights - 2 GB runtime over 2 MiB blocks: ~25,700 blocks, ~411k tokens
    assert 400_000 < int(info["kv_cache_size_tokens"]) < 420_000
    assert value(fams, "vllm:kv_cache_usage_perc") > 0.95
    assert value(fams, "vllm:num_requests_waiting_by_reason", reason="capacity") == value(fams, "vllm:num_requests_waiting") > 0


async def test_served_over_real_http_like_vllm() -> None:
    clock = FakeClock()
    engine = await start_demo_engine(DemoConfig(scenario="steady"), "127.0.0.1", 0, clock=clock)
    try:
        assert engine.url.startswith("http://127.0.0.1:")
        clock.advance(10)
        engine.tick()
        async with aiohttp.ClientSession() as http:
            async with http.get(engine.url + "/metrics") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                fams = families(await r.text())
            assert value(fams, "vllm:num_requests_running") == engine.state()["running"] > 0
            async with http.get(engine.url + "/v1/models") as r:
                model = (await r.json())["data"][0]
            assert model["id"] == "llama-3-8b" and model["max_model_len"] == 8192
            assert model["root"] == "meta-llama/Meta-Llama-3-8B-Instruct"
            async with http.get(engine.url + "/health") as r:
                assert r.status == 200
            async with http.get(engine.url + "/version") as r:
                assert "version" in await r.json()
    finally:
        await engine.stop()


def test_simulated_gpu_reads_busy_and_near_full() -> None:
    engine = busy_engine()
    gpu = engine.nvml.gpus[0]
    assert gpu.memory_used > 0.9 * gpu.memory_total  # vLLM preallocates, whatever the KV occupancy
    assert gpu.gpu_util_percent > 95  # kernel residency: a step is always running
    mbu = engine.state(window=1.0)["mbu"]
    assert gpu.dram_bw_util_percent == pytest.approx(100 * mbu, rel=0.05)
    idle = busy_engine("idle", 5).nvml.gpus[0]
    assert idle.gpu_util_percent == 0 and idle.dram_bw_util_percent == 0
