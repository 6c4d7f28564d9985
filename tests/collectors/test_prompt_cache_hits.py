"""Which engines' prompt-token counters count prefix-cache hits as prompt tokens: the
adapters say so, for the physics to take the hit ratio out of prefill work or mark it (test_derive_served.py)."""

from __future__ import annotations

import re

from rooflight.collectors import dynamo, sglang, tgi, vllm
from support import sample_text, synthetic_page


def _parse(module: object, text: str) -> object:
    return module.parse(text, target="t", timestamp=1.0, duration=0.01)  # type: ignore[attr-defined]


def test_vllm_with_the_by_source_counter_counts_computed_tokens() -> None:
    page = sample_text("vllm-cpu-load-c16.prom")
    assert "vllm:prompt_tokens_by_source_total" in page
    series = _parse(vllm, page).series[0]  # type: ignore[attr-defined]
    assert series.prompt_tokens_include_cache_hits is False


def test_an_older_vllm_counts_hits_as_prompt_tokens_and_keeps_its_hit_counters() -> None:
    page = "\n".join(line for line in sample_text("vllm-cpu-load-c16.prom").splitlines()
                     if "prompt_tokens_by_source" not in line)
    series = _parse(vllm, page).series[0]  # type: ignore[attr-defined]
    assert series.prompt_tokens_total is not None
    assert series.prompt_tokens_include_cache_hits is True
    assert series.prefix_cache_queries_total is not None and series.prefix_cache_hits_total is not None


def test_tgi_and_the_dynamo_frontend_count_hits_and_say_so() -> None:
    t = _parse(tgi, synthetic_page("tgi-3x")).series[0]  # type: ignore[attr-defined]
    assert t.prompt_tokens_total is not None and t.prompt_tokens_include_cache_hits is True
    d = [s for s in _parse(dynamo, synthetic_page("dynamo-frontend")).series  # type: ignore[attr-defined]
         if s.prompt_tokens_total is not None]
    assert d and all(s.prompt_tokens_include_cache_hits for s in d)


def test_sglang_realtime_counters_are_computed_tokens_and_finish_time_ones_are_not() -> None:
    page = sample_text("sglang-docs-llama31-8b-under-load.prom")
    s = _parse(sglang, page).series[0]  # type: ignore[attr-defined]
    realtime = "sglang:realtime_tokens_total" in page
    assert s.prompt_tokens_include_cache_hits is (not realtime and s.prompt_tokens_total is not None)
    old = "\n".join(line for line in page.splitlines() if not re.match(r"(# \w+ )?sglang:realtime_tokens", line))
    s_old = _parse(sglang, old).series[0]  # type: ignore[attr-defined]
    assert s_old.prompt_tokens_include_cache_hits is (s_old.prompt_tokens_total is not None)


def test_a_dynamo_worker_lends_its_prefix_hit_rate_where_the_engine_keeps_none() -> None:
    # trtllm's page here has no prefix-cache accounting; Dynamo's KV stats say 0.4 once it publishes them
    page = sample_text("dynamo-trtllm-worker-2req.prom")
    published = re.sub(r"(dynamo_component_kvstats_total_blocks\{[^}]*\}) 0", r"\1 100", page)
    published = re.sub(r"(dynamo_component_kvstats_gpu_prefix_cache_hit_rate\{[^}]*\}) 0", r"\1 0.4", published)
    assert published != page
    s = _parse(dynamo, published).series[0]  # type: ignore[attr-defined]
    assert s.prefix_cache_hit_ratio == 0.4
    unpublished = re.sub(r"(dynamo_component_kvstats_gpu_prefix_cache_hit_rate\{[^}]*\}) 0", r"\1 0.4", page)
    assert _parse(dynamo, unpublished).series[0].prefix_cache_hit_ratio is None  # type: ignore[attr-defined]
