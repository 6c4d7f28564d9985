"""The Dynamo adapter on the pages a real Dynamo 1.6.1 gave (tests/fixtures/engine-samples/README.md,
`dynamo-1.6.1-*.prom`): the frontend, an aggregated mocker worker, and a prefill and a decode worker."""

from __future__ import annotations

from rooflight.collectors import dynamo, engines
from support import sample_text

AGG_FRONTEND = "dynamo-1.6.1-frontend-agg-load.prom"
AGG_WORKER = "dynamo-1.6.1-mocker-agg-load.prom"
PREFILL = "dynamo-1.6.1-mocker-prefill-load.prom"
DECODE = "dynamo-1.6.1-mocker-decode-load.prom"
DISAGG_FRONTEND = "dynamo-1.6.1-frontend-disagg-load.prom"


def _parse(name: str, text: str | None = None):
    text = sample_text(name) if text is None else text
    assert engines.detect(text) is dynamo
    return dynamo.parse(text, target="t", timestamp=1.0, duration=0.0)


def test_frontend_page_reads_the_deployment_settings_and_load() -> None:
    s = _parse(AGG_FRONTEND)
    (one,) = s.series
    assert s.info.labels["role"] == "frontend"
    assert (one.model, one.running, one.waiting, one.batch_max_requests) == ("tiny", 6.0, 0.0, 8.0)
    assert one.kv_capacity_tokens == 128 * 16  # --num-gpu-blocks-override x --block-size
    assert one.ttft is not None and one.itl is not None and one.generation_tokens_total > 0


def test_aggregated_and_decode_workers_are_read_through_the_mockers_vllm_families() -> None:
    for name, running, waiting in ((AGG_WORKER, 6.0, 0.0), (DECODE, 2.0, 5.0)):
        s = _parse(name)
        (one,) = s.series
        assert (s.engine, s.info.labels["backend"], s.info.labels["dynamo_component"]) == ("dynamo", "vllm", "backend")
        assert (one.model, one.running, one.waiting) == ("tiny", running, waiting), name
        assert one.kv_usage_ratio is not None and one.ttft is not None


def test_prefill_worker_is_the_prefill_role() -> None:
    """Dynamo names a prefill worker's component `prefill` (its page has no vllm:* families); the page
    of a decode worker is an aggregated worker's, so it says nothing."""
    assert _parse(PREFILL).info.role == "prefill"
    assert _parse(DECODE).info.role is None
    assert _parse(AGG_WORKER).info.role is None
    assert _parse(AGG_FRONTEND).info.role is None


def test_worker_running_counts_the_generate_endpoint_only() -> None:
    """1.6.1 counts in-flight per endpoint: beside `generate`, the KV router's worker_kv_query_source_*
    queries, which are not requests the worker serves."""
    text = sample_text(PREFILL)
    generate = [line for line in text.splitlines()
                if line.startswith("dynamo_component_inflight_requests{") and 'dynamo_endpoint="generate"' in line]
    query = [line for line in text.splitlines()
             if line.startswith("dynamo_component_inflight_requests{") and "worker_kv_query_source_" in line]
    assert len(generate) == 1 and len(query) == 1
    busy = text.replace(query[0], query[0].rsplit(" ", 1)[0] + " 3")
    (one,) = _parse(PREFILL, busy).series
    assert one.running == float(generate[0].rsplit(" ", 1)[1]) == 1.0


def test_legacy_kvstats_names_are_on_the_january_2026_worker_page() -> None:
    """collectors/dynamo.py still reads kvstats_* for workers before 1.6 (the real-engine names check
    leaves them out as legacy): they must be on a page of that time."""
    text = sample_text("dynamo-trtllm-worker-2req.prom")
    for name in (dynamo.KV_USAGE, dynamo.KV_TOTAL_BLOCKS, dynamo.PREFIX_HIT_RATE):
        assert f"\n{name}{{" in text, name
    for name in (AGG_FRONTEND, AGG_WORKER, PREFILL, DECODE, DISAGG_FRONTEND):
        assert "kvstats_" not in sample_text(name)
