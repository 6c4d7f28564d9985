"""Every engine adapter against every recorded page (values checked by hand against the files) and
against synthetic pages for what no recording shows: TGI (no public capture exists), a full 2026
trtllm-serve page, a Dynamo frontend, SGLang with DP/TP ranks and pids.

The synthetic pages (tests/fixtures/engine-samples/synthetic/) follow each engine's documented
exposition (docs/engines.md) and are also served to the agent by tests/e2e/test_engines_golden.py.
"""

from __future__ import annotations

import pytest

from rooflight.collectors import dynamo
from rooflight.collectors import llamacpp
from rooflight.collectors import sglang
from rooflight.collectors import tgi
from rooflight.collectors import trtllm
from rooflight.collectors import triton_trtllm
from rooflight.collectors.engines import EngineAdapter
from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import EngineSample, EngineSeries
from support import sample_text, synthetic_page

TGI_PAGE = synthetic_page("tgi-3x")
TRTLLM_PAGE = synthetic_page("trtllm-serve-2026")
DYNAMO_FRONTEND_PAGE = synthetic_page("dynamo-frontend")
SGLANG_DP_PAGE = synthetic_page("sglang-dp2-tp2-pids")


def _parse(adapter: EngineAdapter, text: str) -> EngineSample:
    return adapter.parse(text, target="t", timestamp=100.0, duration=0.01)


def _only(sample: EngineSample) -> EngineSeries:
    assert len(sample.series) == 1, sample.series
    return sample.series[0]


def test_sglang_0_5_in_dynamo_worker_reads_realtime_counters_and_passes() -> None:
    s = _parse(dynamo, sample_text("dynamo-sglang-worker-1req.prom"))
    one = _only(s)
    assert (s.engine, one.model, one.rank) == ("dynamo", "Qwen/Qwen3-0.6B", "0")
    assert s.info.labels["backend"] == "sglang" and s.info.labels["dynamo_component"] == "backend"
    assert (one.prompt_tokens_total, one.generation_tokens_total, one.steps_total) == (33.0, 300.0, 300.0)
    assert (one.running, one.waiting, one.kv_usage_ratio, one.kv_capacity_tokens) == (0.0, 0.0, 0.0, 92962.0)
    assert one.ttft is not None and (one.ttft.count, one.ttft.sum) == (1.0, pytest.approx(1.5573771))
    assert one.itl is not None and one.itl.count == 299.0 and one.itl.buckets[-1] == (float("inf"), 299.0)
    assert one.preemptions_total is None  # this build has only the per-batch gauge
    assert one.extra["token_counters"] == 1.0 and one.extra["prompt_tokens_cached_total"] == 0.0


def test_sglang_2024_falls_back_to_finish_counters_and_old_itl_name() -> None:
    one = _only(_parse(sglang, sample_text("sglang-docs-llama31-8b-under-load.prom")))
    assert (one.model, one.running, one.waiting, one.kv_usage_ratio) == ("meta-llama/Llama-3.1-8B-Instruct", 162.0, 2826.0, 0.28)
    assert (one.prompt_tokens_total, one.generation_tokens_total) == (8128902.0, 7557572.0)
    assert one.extra["token_counters"] == 0.0
    assert one.steps_total is None and one.kv_capacity_tokens is None and one.preemptions_total is None
    assert one.ttft is not None and one.ttft.count == 11008.0
    assert one.itl is not None and one.itl.count == 7400757.0  # time_per_output_token_seconds


def test_sglang_dp_ranks_tp_replicas_and_pids() -> None:
    s = _parse(sglang, SGLANG_DP_PAGE)
    r0, r1 = s.series
    assert (r0.rank, r1.rank) == ("0", "1")
    assert (r0.running, r1.running) == (10.0, 4.0)  # TP replicas read once, never summed
    assert r0.waiting == 3.0  # pid split of a gauge: the max
    assert (r0.prompt_tokens_total, r0.generation_tokens_total, r1.generation_tokens_total) == (900.0, 5000.0, 2000.0)
    assert (r0.steps_total, r1.steps_total) == (730.0, None)
    assert (r0.preemptions_total, r1.preemptions_total) == (None, 6.0)
    assert r0.ttft is not None and (r0.ttft.count, r0.ttft.buckets[0]) == (5.0, (0.1, 4.0))  # is_streaming summed
    assert r1.ttft is None  # the tokenizer's histograms cover every rank; reported once, on rank 0
    assert s.info.tensor_parallel_size == 2 and s.info.kv_block_size_tokens == 16.0


def test_trtllm_serve_full_page() -> None:
    s = _parse(trtllm, TRTLLM_PAGE)
    one = _only(s)
    assert (one.model, one.running, one.waiting, one.batch_max_requests) == ("llama-3-8b", 12.0, 5.0, 64.0)
    assert (one.kv_usage_ratio, one.kv_capacity_tokens) == (0.625, 4096.0 * 32)
    assert one.prompt_tokens_total == 52000.0 - 12000.0 and one.generation_tokens_total == 81000.0
    assert one.ttft is not None and one.ttft.count == 320.0
    assert one.itl is None and one.steps_total is None and one.preemptions_total is None  # per-request TPOT is not ITL
    assert one.extra["requests_success_total"] == 320.0 and one.extra["paused_requests"] == 1.0
    assert one.extra["spec_decode_num_accepted_tokens_total"] == 2600.0
    assert s.info.tensor_parallel_size == 2 and s.info.kv_cache_dtype == "fp8" and s.info.kv_block_size_tokens == 32.0
    assert s.info.labels["gpu_type"] == "NVIDIA H100 80GB HBM3" and s.info.labels["max_model_len"] == "8192"


def test_trtllm_in_dynamo_worker_has_only_request_families() -> None:
    s = _parse(dynamo, sample_text("dynamo-trtllm-worker-2req.prom"))
    one = _only(s)
    assert s.info.labels["backend"] == "trtllm" and one.model == "Qwen/Qwen3-0.6B"
    assert one.ttft is not None and (one.ttft.count, one.ttft.sum) == (2.0, pytest.approx(0.06795299984514713))
    assert one.running == 0.0  # dynamo_component_inflight_requests: the engine page has no running gauge
    assert one.kv_usage_ratio is None  # kvstats read 0 of 0 total blocks: not an occupancy
    assert one.prompt_tokens_total is None and one.generation_tokens_total is None and one.itl is None


def test_triton_trtllm_ifb_page() -> None:
    s = _parse(triton_trtllm, sample_text("triton-trtllm-backend-ifb-readme.prom"))
    one = _only(s)
    assert (one.model, one.running, one.waiting, one.batch_max_requests) == ("tensorrt_llm", 0.0, 1.0, 512.0)
    assert (one.kv_usage_ratio, one.kv_capacity_tokens, one.steps_total) == (0.4875, 6239.0 * 64, 0.0)
    assert one.extra["request_type_scheduled"] == 1.0 and one.extra["memory_type_gpu"] == 1610236.0
    assert one.prompt_tokens_total is None and one.ttft is None and one.preemptions_total is None
    assert s.engine == "triton" and s.info.kv_block_size_tokens == 64.0


@pytest.mark.parametrize("name", ["triton-core-metrics-trtllm-readme.prom", "triton-trtllm-backend-v1-readme.prom"])
def test_triton_pages_without_batch_state_give_extras_only(name: str) -> None:
    one = _only(_parse(triton_trtllm, sample_text(name)))
    assert one.model == "tensorrt_llm"
    assert all(getattr(one, f) is None for f in ("running", "waiting", "kv_usage_ratio", "generation_tokens_total", "steps_total"))
    assert one.extra  # what the page did say is kept
    if "v1" in name:
        assert one.extra["v1_specific_metric_total_generation_tokens"] == 20.0  # a per-iteration gauge, not a counter
    else:
        assert one.extra["requests_success_total"] == 0.0 and one.extra["pending_requests"] == 0.0


def test_llamacpp_reads_counters_not_scrape_reset_averages() -> None:
    one = _only(_parse(llamacpp, sample_text("llamacpp-server-cpu-load-c8.prom")))
    assert (one.model, one.running, one.waiting) == ("", 4.0, 3.0)
    assert (one.prompt_tokens_total, one.generation_tokens_total, one.steps_total) == (1503.0, 6400.0, 1887.0)
    assert one.extra["generation_seconds_total"] == 6.11724 and one.extra["n_tokens_max"] == 323.0
    assert 841.842 not in one.extra.values() and 22035.5 not in one.extra.values()  # the reset-per-scrape gauges
    assert all(getattr(one, f) is None for f in ("kv_usage_ratio", "kv_capacity_tokens", "preemptions_total", "ttft", "itl"))


def test_llamacpp_old_name_and_bad_values() -> None:
    page = "llamacpp:n_past_max 77\nllamacpp:requests_processing NaN\nllamacpp:n_decode_total -3\nllamacpp:tokens_predicted_total 9\n"
    one = _only(_parse(llamacpp, page))
    assert one.extra["n_tokens_max"] == 77.0 and one.running is None and one.steps_total is None
    assert one.generation_tokens_total == 9.0


def test_tgi_counters_without_total_and_no_made_up_latency() -> None:
    one = _only(_parse(tgi, TGI_PAGE))
    assert (one.running, one.waiting, one.kv_capacity_tokens) == (6.0, 3.0, 163840.0)
    assert (one.prompt_tokens_total, one.generation_tokens_total, one.steps_total) == (4100.0, 5000.0, 3025.0)
    assert one.extra["requests_failure_total"] == 3.0 and one.extra["decode_forward_seconds_total"] == 45.06
    assert all(getattr(one, f) is None for f in ("kv_usage_ratio", "batch_max_requests", "preemptions_total", "ttft", "itl"))


def test_tgi_summary_sums_are_read_and_quantiles_never() -> None:
    page = (
        "# TYPE tgi_request_generated_tokens summary\n"
        'tgi_request_generated_tokens{quantile="0.5"} 120\n'
        "tgi_request_generated_tokens_sum 1200\ntgi_request_generated_tokens_count 10\n"
        "# TYPE tgi_batch_inference_count_total counter\n"
        'tgi_batch_inference_count_total{method="decode"} 50\n'
    )
    one = _only(_parse(tgi, page))
    assert one.generation_tokens_total == 1200.0 and one.steps_total == 50.0 and one.ttft is None


def test_sglang_prefix_cache_from_realtime_counters_and_queue_time_from_the_scheduler() -> None:
    one = _only(_parse(dynamo, sample_text("dynamo-sglang-worker-1req.prom")))
    assert (one.prefix_cache_queries_total, one.prefix_cache_hits_total) == (33.0, 0.0)  # prefill_compute + _cache
    assert one.prefix_cache_hit_ratio == 0.0  # the last batch's gauge is read too; the counters win downstream
    assert one.queue_time is not None and one.queue_time.count == 1.0 and one.queue_time.buckets[1] == (0.1, 1.0)
    assert one.prompt_length is None and one.output_length is None  # only with --collect-tokens-histogram


def test_sglang_2024_has_only_the_last_batch_hit_rate_gauge() -> None:
    one = _only(_parse(sglang, sample_text("sglang-docs-llama31-8b-under-load.prom")))
    assert one.prefix_cache_queries_total is None and one.prefix_cache_hits_total is None
    assert one.prefix_cache_hit_ratio == pytest.approx(0.007507552643049313)


def _sglang_hist(name: str, labels: str, counts: tuple[float, float]) -> str:
    return (f'sglang:{name}_bucket{{{labels},le="10"}} {counts[0]}\n'
            f'sglang:{name}_bucket{{{labels},le="+Inf"}} {counts[1]}\n'
            f"sglang:{name}_count{{{labels}}} {counts[1]}\nsglang:{name}_sum{{{labels}}} 50\n")


def test_sglang_scheduler_histograms_take_the_lowest_replica_and_lengths_the_tokenizers() -> None:
    sched = 'model_name="m",pp_rank="0",moe_ep_rank="0"'
    page = (
        _sglang_hist("queue_time_seconds", sched + ',dp_rank="0",tp_rank="1"', (9.0, 9.0))
        + _sglang_hist("queue_time_seconds", sched + ',dp_rank="0",tp_rank="0"', (2.0, 3.0))
        + _sglang_hist("queue_time_seconds", sched + ',dp_rank="1",tp_rank="0"', (1.0, 1.0))
        + _sglang_hist("prompt_tokens_histogram", 'model_name="m",is_streaming="true"', (4.0, 6.0))
        + _sglang_hist("prompt_tokens_histogram", 'model_name="m",is_streaming="false"', (1.0, 1.0))
        + _sglang_hist("generation_tokens_histogram", 'model_name="m"', (0.0, 2.0))
        + 'sglang:cache_hit_rate{model_name="m",dp_rank="0"} 1.5\n'
    )
    r0, r1 = _parse(sglang, page).series
    assert r0.queue_time is not None and (r0.queue_time.count, r0.queue_time.buckets[0]) == (3.0, (10.0, 2.0))
    assert r1.queue_time is not None and r1.queue_time.count == 1.0  # each DP rank its own scheduler
    assert r0.prompt_length is not None and r0.prompt_length.count == 7.0  # is_streaming summed
    assert r0.output_length is not None and r0.output_length.count == 2.0
    assert r1.prompt_length is None  # the tokenizer's, reported once on rank 0
    assert r0.prefix_cache_hit_ratio is None  # 1.5 is not a ratio


def test_llamacpp_prefix_cache_from_its_cached_prompt_counter() -> None:
    one = _only(_parse(llamacpp, sample_text("llamacpp-server-cpu-load-c8.prom")))
    assert (one.prefix_cache_hits_total, one.prefix_cache_queries_total) == (35.0, 1503.0 + 35.0)
    older = _only(_parse(llamacpp, "llamacpp:prompt_tokens_total 10\n"))
    assert older.prefix_cache_hits_total is None and older.prefix_cache_queries_total is None


def test_tgi_request_histograms_are_read_and_summaries_are_not() -> None:
    one = _only(_parse(tgi, TGI_PAGE))
    assert one.prompt_length is not None and (one.prompt_length.count, one.prompt_length.sum) == (22.0, 4100.0)
    assert one.output_length is not None and one.output_length.count == 20.0
    assert one.queue_time is None  # not on this page
    queue = 'tgi_request_queue_duration_bucket{le="0.5"} 3\ntgi_request_queue_duration_bucket{le="+Inf"} 4\n' \
            "tgi_request_queue_duration_count 4\ntgi_request_queue_duration_sum 1.5\ntgi_queue_size 0\n"
    assert _only(_parse(tgi, queue)).queue_time.buckets[0] == (0.5, 3.0)  # type: ignore[union-attr]
    summary = ('tgi_request_generated_tokens{quantile="0.5"} 120\n'
               "tgi_request_generated_tokens_sum 1200\ntgi_request_generated_tokens_count 10\n")
    assert _only(_parse(tgi, summary)).output_length is None


def test_dynamo_frontend_joins_model_case_insensitively() -> None:
    s = _parse(dynamo, DYNAMO_FRONTEND_PAGE)
    one = _only(s)
    assert s.info.labels == {"role": "frontend"}
    assert (one.model, one.running, one.waiting, one.batch_max_requests) == ("Qwen/Qwen3-0.6B", 7.0, 2.0, 256.0)
    assert (one.kv_capacity_tokens, one.prompt_tokens_total, one.generation_tokens_total) == (92962.0, 330.0, 2700.0)
    assert one.ttft is not None and one.ttft.count == 10.0 and one.itl is not None and one.itl.count == 2690.0
    assert one.kv_usage_ratio is None and one.steps_total is None and one.extra["requests_total"] == 10.0


def test_dynamo_worker_kvstats_used_once_blocks_are_published() -> None:
    page = sample_text("dynamo-trtllm-worker-2req.prom").replace(
        'kvstats_total_blocks{dynamo_component="tensorrt_llm",dynamo_namespace="dynamo"} 0',
        'kvstats_total_blocks{dynamo_component="tensorrt_llm",dynamo_namespace="dynamo"} 500',
    ).replace(
        'kvstats_gpu_cache_usage_percent{dynamo_component="tensorrt_llm",dynamo_namespace="dynamo"} 0',
        'kvstats_gpu_cache_usage_percent{dynamo_component="tensorrt_llm",dynamo_namespace="dynamo"} 0.25',
    )
    assert _only(_parse(dynamo, page)).kv_usage_ratio == 0.25


@pytest.mark.parametrize("module", [sglang, tgi, trtllm, triton_trtllm, llamacpp, dynamo])
def test_a_page_of_another_engine_is_a_parse_error(module: EngineAdapter) -> None:
    with pytest.raises(ParseError):
        _parse(module, "# TYPE foo_bar gauge\nfoo_bar 1\n")
