"""What the agent exports of the engine facts beyond the roofline: the prefix-cache hit ratio, the per-request
prompt/output length and queue-time percentiles, and the engine's settings as an info metric. An agent samples a
FakeEngine twice, 10 s apart, and the values are checked against what the two pages and the info endpoint say."""

from __future__ import annotations

from typing import Iterator

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from rooflight.agent.metrics import names as n
from rooflight.agent.metrics.exposition import registry_for
from rooflight.agent.sampling.clock import FakeClock
from rooflight.agent.config.agent import build
from support import FakeEngine, promtool_clean, started_agent

L = 'engine="0",model_name="m"'


def _vllm_page(queries: float, hits: float, prompt_buckets: tuple[float, float, float]) -> str:
    """A vLLM page: prefix-cache counters, a prompt-length histogram (le 10, 100, +Inf) and one cache config."""
    le10, le100, inf = prompt_buckets
    return "\n".join([
        f"vllm:num_requests_running{{{L}}} 1",
        f"vllm:prefix_cache_queries_total{{{L}}} {queries}",
        f"vllm:prefix_cache_hits_total{{{L}}} {hits}",
        f'vllm:request_prompt_tokens_bucket{{{L},le="10.0"}} {le10}',
        f'vllm:request_prompt_tokens_bucket{{{L},le="100.0"}} {le100}',
        f'vllm:request_prompt_tokens_bucket{{{L},le="+Inf"}} {inf}',
        f"vllm:request_prompt_tokens_count{{{L}}} {inf}",
        f"vllm:request_prompt_tokens_sum{{{L}}} 0",
        'vllm:cache_config_info{engine="0",block_size="16",gpu_memory_utilization="0.9",num_gpu_blocks="4096",'
        'enable_prefix_caching="True",prefix_caching_hash_algo="sha256"} 1',
    ]) + "\n"


async def _observe(engine: FakeEngine, first: str, second: str) -> str:
    clock = FakeClock()
    config = build({}, {}, {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "1s",
                            "windows": "10s,1m", "model": "llama-3-8b", "gpu": "h100-sxm"})
    async with started_agent(config, loops=False, clock=clock, nvml_lib=None) as agent:
        engine.body = first
        await agent.sample_engines_once()
        clock.advance(10.0)
        engine.body = second
        await agent.sample_engines_once()
        text = generate_latest(registry_for(lambda: agent.snapshot)).decode()
    promtool_clean(text)
    return text


def _samples(text: str, name: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        yield from (s for s in family.samples if s.name == name)


def _one(text: str, name: str, **labels: str) -> float:
    [value] = [s.value for s in _samples(text, name) if labels.items() <= s.labels.items()]
    return value


async def test_vllm_hit_ratio_prompt_percentiles_and_settings(fake_engine: FakeEngine) -> None:
    fake_engine.json_routes["/v1/models"] = {"data": [{"id": "m", "root": "/models/m", "max_model_len": 4096}]}
    text = await _observe(fake_engine, _vllm_page(1000, 100, (0, 0, 0)), _vllm_page(3000, 700, (2, 8, 10)))
    # hits 600 of 2,000 tokens looked up in the window; the running totals (10%, then 23%) are not the answer
    assert _one(text, n.PREFIX_CACHE_HIT_RATIO, window="10s") == 0.3
    # 10 prompts: 2 up to 10 tokens, 6 in (10, 100], 2 above. p50: rank 5 is the 3rd of 6 in (10, 100]
    assert _one(text, n.REQUEST_PROMPT_TOKENS, window="10s", percentile="50") == 10 + 90 * 3 / 6
    assert _one(text, n.REQUEST_PROMPT_TOKENS, window="10s", percentile="99") == 100.0  # +Inf: the last bound
    [info] = list(_samples(text, n.ENGINE_CONFIG_INFO))
    assert info.value == 1.0
    assert info.labels == {"target": info.labels["target"], "engine": "vllm", "model": "m", "rank": "0",
                           "block_size": "16", "gpu_memory_utilization": "0.9", "num_gpu_blocks": "4096",
                           "enable_prefix_caching": "true", "max_model_len": "4096"}  # page + /v1/models


async def test_no_lookups_in_the_window_is_no_hit_ratio_not_zero(fake_engine: FakeEngine) -> None:
    page = _vllm_page(1000, 100, (1, 1, 1))
    text = await _observe(fake_engine, page, page)
    assert list(_samples(text, n.PREFIX_CACHE_HIT_RATIO)) == []
    assert list(_samples(text, n.REQUEST_PROMPT_TOKENS)) == []  # no request finished in the window


SERVER_INFO = {"model_path": "Qwen/Qwen3-0.6B", "tp_size": 1, "dp_size": 1, "chunked_prefill_size": 8192,
               "max_prefill_tokens": 16384, "schedule_policy": "fcfs", "mem_fraction_static": 0.88,
               "disable_radix_cache": False, "max_running_requests": None, "api_key": "never-exported",
               "internal_states": [{"effective_max_running_requests_per_dp": 512}]}


async def test_sglang_settings_from_server_info_and_the_last_batch_gauge(fake_engine: FakeEngine) -> None:
    fake_engine.json_routes["/server_info"] = SERVER_INFO
    page = 'sglang:num_running_reqs{model_name="q"} 2\nsglang:cache_hit_rate{model_name="q"} %s\n'
    text = await _observe(fake_engine, page % "0.2", page % "0.6")
    # no counters on this page: the time-weighted mean of the gauge over the window (0.2 held 10 s, then 0.6)
    assert _one(text, n.PREFIX_CACHE_HIT_RATIO, window="10s") == 0.2
    [info] = list(_samples(text, n.ENGINE_CONFIG_INFO))
    settings = {k: v for k, v in info.labels.items() if k not in ("target", "engine", "model", "rank")}
    assert settings == {"chunked_prefill_size": "8192", "max_prefill_tokens": "16384", "schedule_policy": "fcfs",
                        "mem_fraction_static": "0.88", "disable_radix_cache": "false",
                        "max_running_requests": "512", "tp_size": "1", "dp_size": "1"}
