"""collectors/vllm: every recorded vLLM page, plus the synthetic cases the recordings do not cover
(data-parallel ranks, API-server pids, deprecated names, NaN, duplicates)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rooflight.collectors import expfmt, vllm
from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import MAX_SETTING_CHARS, EngineSeries
from support import SAMPLES

VLLM_FILES = sorted(SAMPLES.glob("vllm-*.prom"))
# A Dynamo worker serving vLLM (or its mocker) passes vLLM's families through: the Dynamo adapter goes
# first in detection (docs/engines.md), and vLLM's reads them, so those pages are vLLM's here too.
VLLM_IN_DYNAMO = {SAMPLES / "dynamo-1.6.1-mocker-agg-load.prom", SAMPLES / "dynamo-1.6.1-mocker-decode-load.prom"}
OTHER_FILES = sorted(set(SAMPLES.glob("*.prom")) - set(VLLM_FILES) - VLLM_IN_DYNAMO)


def read(path: Path) -> vllm.EngineSample:
    return vllm.parse(path.read_text(), target="t:8000", timestamp=100.0, duration=0.02)


def only(sample: vllm.EngineSample) -> EngineSeries:
    (series,) = sample.series
    return series


def test_every_vllm_recording_is_there() -> None:
    assert {p.name for p in VLLM_FILES} >= {
        "vllm-cpu-load-c16.prom",
        "vllm-cpu-rest-fresh.prom",
        "vllm-cpu-preempt-during.prom",
    }


@pytest.mark.parametrize("path", VLLM_FILES, ids=lambda p: p.name)
def test_agrees_with_prometheus_client_on_every_recording(path: Path) -> None:
    """Each normalized field equals the wire value prometheus_client reads for it."""
    text = path.read_text()
    wire: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            wire[(s.name, tuple(sorted(s.labels.items())))] = s.value
    sample = read(path)
    assert vllm.recognises(text)
    assert (sample.target, sample.engine, sample.timestamp, sample.duration) == ("t:8000", "vllm", 100.0, 0.02)
    s = only(sample)
    base = (("engine", s.rank), ("model_name", s.model))

    def at(name: str, *extra: tuple[str, str]) -> float:
        return wire[(name, tuple(sorted(base + extra)))]

    assert s.running == at("vllm:num_requests_running")
    assert s.waiting == at("vllm:num_requests_waiting")
    assert s.waiting_by_reason == {
        r: at("vllm:num_requests_waiting_by_reason", ("reason", r)) for r in ("capacity", "deferred")
    }
    assert s.kv_usage_ratio == at("vllm:kv_cache_usage_perc")
    assert s.prompt_tokens_total == at("vllm:prompt_tokens_by_source_total", ("source", "local_compute"))
    assert s.extra["prompt_tokens_all_total"] == at("vllm:prompt_tokens_total")
    assert s.extra["prompt_tokens_cached_total"] == at("vllm:prompt_tokens_cached_total")
    assert s.generation_tokens_total == at("vllm:generation_tokens_total")
    assert s.steps_total == at("vllm:iteration_tokens_total_count")
    assert s.extra["iteration_tokens_sum"] == at("vllm:iteration_tokens_total_sum")
    assert s.preemptions_total == at("vllm:num_preemptions_total")
    for key in ("estimated_flops_per_gpu_total", "prefix_cache_hits_total", "prefix_cache_queries_total"):
        assert s.extra[key] == at(f"vllm:{key}")
    for hist, base_name in ((s.ttft, "vllm:time_to_first_token_seconds"), (s.itl, "vllm:inter_token_latency_seconds")):
        assert hist is not None
        assert hist.count == at(base_name + "_count") and hist.sum == at(base_name + "_sum")
        assert hist.buckets[-1] == (math.inf, hist.count)
        assert [b for b, _ in hist.buckets] == sorted(b for b, _ in hist.buckets)
        for bound, count in hist.buckets:
            le = "+Inf" if bound == math.inf else repr(bound)
            assert count == at(base_name + "_bucket", ("le", le))
    config = next(k for k in wire if k[0] == "vllm:cache_config_info")
    labels = dict(config[1])
    assert s.kv_capacity_tokens == float(labels["kv_cache_size_tokens"])
    assert sample.info.kv_block_size_tokens == float(labels["block_size"])
    assert sample.info.kv_cache_dtype == labels["cache_dtype"]
    assert dict(sample.info.labels) == {k: v for k, v in labels.items() if k != "engine"}


def test_load_recording_numbers() -> None:
    s = only(read(SAMPLES / "vllm-cpu-load-c16.prom"))
    assert (s.model, s.rank) == ("tiny-llama", "0")
    assert (s.running, s.waiting, s.preemptions_total) == (16.0, 0.0, 0.0)
    assert (s.prompt_tokens_total, s.generation_tokens_total, s.steps_total) == (1688.0, 8096.0, 508.0)
    assert s.kv_capacity_tokens == 1048576.0
    assert s.kv_usage_ratio == pytest.approx(0.005860090343059454)
    assert (s.ttft.count, s.itl.count) == (32.0, 8064.0)
    assert s.batch_max_requests is None  # vLLM does not export max_num_seqs
    # tokens per step (iteration_tokens_total's buckets): the head-of-line detector's largest step
    assert s.step_tokens is not None and s.step_tokens.count == s.steps_total
    assert dict(s.step_tokens.buckets)[16.0] == 503.0
    assert dict(s.step_tokens.buckets)[1024.0] == 508.0


def test_preemption_recording_numbers() -> None:
    sample = read(SAMPLES / "vllm-cpu-preempt-during.prom")
    s = only(sample)
    assert (s.running, s.waiting, s.kv_usage_ratio, s.preemptions_total) == (3.0, 4.0, 1.0, 48.0)
    assert s.waiting_by_reason == {"capacity": 4.0, "deferred": 0.0}
    assert s.kv_capacity_tokens == 1280.0  # 10 blocks x 128
    assert sample.info.labels["num_gpu_blocks_override"] == "10"


def test_fresh_recording_is_all_zero_but_present() -> None:
    s = only(read(SAMPLES / "vllm-cpu-rest-fresh.prom"))
    assert (s.running, s.waiting, s.prompt_tokens_total, s.steps_total) == (0.0, 0.0, 0.0, 0.0)
    assert s.ttft is not None and s.ttft.count == 0.0


@pytest.mark.parametrize("path", OTHER_FILES, ids=lambda p: p.name)
def test_other_engines_are_not_recognised_and_do_not_parse(path: Path) -> None:
    text = path.read_text()
    assert not vllm.recognises(text)
    with pytest.raises(ParseError):
        vllm.parse(text, target="t", timestamp=0.0, duration=0.0)


def test_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        vllm.parse("<html>oops</html>\n", target="t", timestamp=0.0, duration=0.0)
    assert not vllm.recognises("<html>oops</html>")


# --- synthetic pages --------------------------------------------------------------------------------


def page(*lines: str) -> vllm.EngineSample:
    return vllm.parse("\n".join(lines) + "\n", target="t", timestamp=1.0, duration=0.0)


def L(model: str = "m", engine: str | None = "0", **more: str) -> str:  # noqa: N802 - label helper
    labels = {"model_name": model, **({"engine": engine} if engine is not None else {}), **more}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def test_data_parallel_ranks_and_models_are_separate_series_joined_to_their_cache_config() -> None:
    sample = page(
        f"vllm:num_requests_running{L('a', '0')} 3",
        f"vllm:num_requests_running{L('a', '1')} 5",
        f"vllm:num_requests_running{L('b', '1')} 7",
        'vllm:cache_config_info{engine="1",block_size="16",num_gpu_blocks="100",kv_cache_size_tokens="None",cache_dtype="fp8"} 1',
        'vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="50",cache_dtype="fp8_e4m3"} 1',
    )
    got = {(s.model, s.rank): (s.running, s.kv_capacity_tokens) for s in sample.series}
    assert got == {("a", "0"): (3.0, 800.0), ("a", "1"): (5.0, 1600.0), ("b", "1"): (7.0, 1600.0)}
    assert sample.info.kv_cache_dtype == "fp8_e4m3"  # rank 0's config describes the engine
    assert sample.info.kv_block_size_tokens == 16.0


def test_missing_engine_label_means_rank_zero() -> None:
    s = only(page(f"vllm:num_requests_waiting{L(engine=None)} 2"))
    assert (s.rank, s.waiting, s.kv_capacity_tokens) == ("0", 2.0, None)


def test_deprecated_names_are_read_when_new_ones_are_absent() -> None:
    s = only(
        page(
            f"vllm:gpu_cache_usage_perc{L()} 0.25",
            f"vllm:gpu_prefix_cache_hits_total{L()} 3",
            f"vllm:gpu_prefix_cache_queries_total{L()} 9",
            f'vllm:time_per_output_token_seconds_bucket{L(le="0.1")} 4',
            f'vllm:time_per_output_token_seconds_bucket{L(le="+Inf")} 5',
            f"vllm:time_per_output_token_seconds_count{L()} 5",
            f"vllm:time_per_output_token_seconds_sum{L()} 0.6",
            f"vllm:prompt_tokens_total{L()} 40",
        )
    )
    assert s.kv_usage_ratio == 0.25
    assert (s.extra["prefix_cache_hits_total"], s.extra["prefix_cache_queries_total"]) == (3.0, 9.0)
    assert s.itl is not None and s.itl.buckets == ((0.1, 4.0), (math.inf, 5.0))
    assert s.prompt_tokens_total == 40.0  # no by-source split on this server


def test_new_names_win_over_deprecated_ones() -> None:
    s = only(
        page(
            f"vllm:gpu_cache_usage_perc{L()} 0.25",
            f"vllm:kv_cache_usage_perc{L()} 0.5",
            f'vllm:time_per_output_token_seconds_bucket{L(le="+Inf")} 5',
            f"vllm:time_per_output_token_seconds_count{L()} 5",
            f"vllm:time_per_output_token_seconds_sum{L()} 9",
            f'vllm:inter_token_latency_seconds_bucket{L(le="+Inf")} 2',
            f"vllm:inter_token_latency_seconds_count{L()} 2",
            f"vllm:inter_token_latency_seconds_sum{L()} 1",
        )
    )
    assert s.kv_usage_ratio == 0.5
    assert (s.itl.count, s.itl.sum) == (2.0, 1.0)


def test_computed_prompt_tokens_are_preferred_and_the_rest_kept_in_extra() -> None:
    s = only(
        page(
            f"vllm:prompt_tokens_total{L()} 100",
            f'vllm:prompt_tokens_by_source_total{L(source="local_compute")} 60',
            f'vllm:prompt_tokens_by_source_total{L(source="local_cache_hit")} 40',
            f"vllm:prompt_tokens_cached_total{L()} 40",
            f"vllm:spec_decode_num_accepted_tokens_total{L()} 7",
        )
    )
    assert s.prompt_tokens_total == 60.0
    assert s.extra["prompt_tokens_all_total"] == 100.0
    assert s.extra["prompt_tokens_cached_total"] == 40.0
    assert s.extra["prompt_tokens_local_cache_hit_total"] == 40.0
    assert s.extra["spec_decode_num_accepted_tokens_total"] == 7.0


def test_multiprocess_pids_gauges_take_max_counters_and_histograms_sum() -> None:
    s = only(
        page(
            f'vllm:kv_cache_usage_perc{L(pid="11")} 0.4',
            f'vllm:kv_cache_usage_perc{L(pid="12")} 0.6',
            f'vllm:num_requests_running{L(pid="11")} 8',
            f'vllm:num_requests_running{L(pid="12")} 8',
            f'vllm:generation_tokens_total{L(pid="11")} 100',
            f'vllm:generation_tokens_total{L(pid="12")} 50',
            f'vllm:time_to_first_token_seconds_bucket{L(pid="11", le="+Inf")} 1',
            f'vllm:time_to_first_token_seconds_bucket{L(pid="12", le="+Inf")} 2',
            f'vllm:time_to_first_token_seconds_count{L(pid="11")} 1',
            f'vllm:time_to_first_token_seconds_count{L(pid="12")} 2',
            f'vllm:time_to_first_token_seconds_sum{L(pid="11")} 0.5',
            f'vllm:time_to_first_token_seconds_sum{L(pid="12")} 0.25',
        )
    )
    assert (s.kv_usage_ratio, s.running, s.generation_tokens_total) == (0.6, 8.0, 150.0)
    assert (s.ttft.count, s.ttft.sum, s.ttft.buckets) == (3.0, 0.75, ((math.inf, 3.0),))


def test_pid_parts_summing_past_the_largest_float_lose_that_counter_not_the_page() -> None:
    """Two API servers' counters of 1e308 each (an attacker's page) sum to no number: that counter is absent,
    the rest of the series is read."""
    s = only(
        page(
            f'vllm:generation_tokens_total{L(pid="11")} 1e308',
            f'vllm:generation_tokens_total{L(pid="12")} 1e308',
            f'vllm:num_requests_running{L(pid="11")} 8',
        )
    )
    assert (s.generation_tokens_total, s.running) == (None, 8.0)


def test_nan_inf_and_negative_values_become_none() -> None:
    s = only(
        page(
            f"vllm:num_requests_running{L()} NaN",
            f"vllm:kv_cache_usage_perc{L()} +Inf",
            f"vllm:generation_tokens_total{L()} -3",
            f"vllm:num_preemptions_total{L()} NaN",
            f"vllm:num_requests_waiting{L()} 1",
            f'vllm:time_to_first_token_seconds_bucket{L(le="+Inf")} NaN',
            f"vllm:time_to_first_token_seconds_count{L()} 1",
            f"vllm:time_to_first_token_seconds_sum{L()} 1",
        )
    )
    assert (s.running, s.kv_usage_ratio, s.generation_tokens_total, s.preemptions_total) == (None,) * 4
    assert s.ttft is None
    assert s.waiting == 1.0


def test_duplicate_series_last_one_wins() -> None:
    s = only(page(f"vllm:num_requests_running{L()} 1", f"vllm:num_requests_running{L()} 4"))
    assert s.running == 4.0


def test_unparsable_lines_among_good_ones_are_skipped() -> None:
    s = only(page(f"vllm:num_requests_running{L()} oops", f"vllm:num_requests_waiting{L()} 2"))
    assert (s.running, s.waiting) == (None, 2.0)


def test_capacity_from_blocks_when_size_tokens_is_not_a_number() -> None:
    assert vllm.kv_capacity_tokens({"kv_cache_size_tokens": "None", "num_gpu_blocks": "10", "block_size": "128"}) == 1280.0
    assert vllm.kv_capacity_tokens({"num_gpu_blocks": "None", "block_size": "128"}) is None
    assert vllm.kv_capacity_tokens({"kv_cache_size_tokens": "2048"}) == 2048.0


def test_lora_info_latest_series_becomes_adapter_counts() -> None:
    s = page(
        f"vllm:num_requests_running{L()} 2",
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql,chat",waiting_lora_adapters=""} 1700000100.0',
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql",waiting_lora_adapters="chat"} 1700000050.0',
    ).series[0]
    assert (s.extra["lora_max_adapters"], s.extra["lora_running_adapters"], s.extra["lora_waiting_adapters"]) == (4.0, 2.0, 0.0)
    assert "lora_max_adapters" not in page(f"vllm:num_requests_running{L()} 2").series[0].extra


def test_a_cut_adapter_list_is_not_counted() -> None:
    running = ",".join(f"adapter-{i:03d}" for i in range(40))  # 479 characters: cut at 128 when read
    with expfmt.bounded(expfmt.Bounds()) as bounds:  # as the agent reads every engine page
        s = page(
            f"vllm:num_requests_running{L()} 2",
            f'vllm:lora_requests_info{{max_lora="64",running_lora_adapters="{running}",waiting_lora_adapters="a,b"}} 1.7e9',
        ).series[0]
    assert bounds.labels_truncated == 1
    assert "lora_running_adapters" not in s.extra  # 10 names and a marker would be a wrong count
    assert (s.extra["lora_waiting_adapters"], s.extra["lora_max_adapters"]) == (2.0, 64.0)


# --- prefix cache, request histograms, settings (rooflight_engine_config_info) -------------------------


def _page_count(text: str, family: str) -> float:
    """The `_count` of a histogram family on a page, read with prometheus_client's parser."""
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return next(s.value for s in fam.samples if s.name.endswith("_count"))
    raise AssertionError(f"{family} not on the page")


def test_request_histograms_and_prefix_counters_on_the_load_recording() -> None:
    text = (SAMPLES / "vllm-cpu-load-c16.prom").read_text()
    s = only(read(SAMPLES / "vllm-cpu-load-c16.prom"))
    for got, family in ((s.prompt_length, "vllm:request_prompt_tokens"),
                        (s.output_length, "vllm:request_generation_tokens"),
                        (s.queue_time, "vllm:request_queue_time_seconds")):
        assert got is not None and got.count == _page_count(text, family) > 0, family
        assert math.isinf(got.buckets[-1][0])
    assert (s.prefix_cache_queries_total, s.prefix_cache_hits_total) == (1688.0, 0.0)
    assert s.prefix_cache_hit_ratio is None  # vLLM keeps counters; no gauge stands in


def test_settings_are_each_ranks_allowlisted_cache_config_labels() -> None:
    sample = page(
        f"vllm:num_requests_running{L('a', '0')} 3",
        f"vllm:num_requests_running{L('a', '1')} 5",
        'vllm:cache_config_info{engine="0",block_size="16",num_gpu_blocks="50",enable_prefix_caching="True",'
        'sliding_window="None",prefix_caching_hash_algo="sha256",gpu_memory_utilization="0.9"} 1',
        'vllm:cache_config_info{engine="1",block_size="16",num_gpu_blocks="70",enable_prefix_caching="False"} 1',
    )
    by_rank = {s.rank: dict(s.settings) for s in sample.series}
    assert by_rank["0"] == {"block_size": "16", "num_gpu_blocks": "50", "enable_prefix_caching": "true",
                            "gpu_memory_utilization": "0.9"}  # "None" says nothing; hash_algo is no lever
    assert by_rank["1"] == {"block_size": "16", "num_gpu_blocks": "70", "enable_prefix_caching": "false"}
    assert set(vllm.SETTINGS) >= set(by_rank["0"]) | set(by_rank["1"])


def test_no_cache_config_means_no_settings() -> None:
    assert only(page(f"vllm:num_requests_running{L()} 1")).settings == {}


def test_a_long_setting_value_is_cut() -> None:
    s = only(page(f"vllm:num_requests_running{L()} 1", 'vllm:cache_config_info{engine="0",cache_dtype="' + "x" * 300 + '"} 1'))
    assert s.settings["cache_dtype"] == "x" * MAX_SETTING_CHARS
