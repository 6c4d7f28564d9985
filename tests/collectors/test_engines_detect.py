"""Auto-detection from the exposition itself, its error for what it cannot place, the info parsers,
and the adapter protocol every registered engine module satisfies."""

from __future__ import annotations

import pytest

from rooflight.collectors import engines, registry
from rooflight.collectors.errors import ParseError
from rooflight.collectors.samples import EngineInfoHints
from support import SAMPLES, sample_text, synthetic_page

TGI_PAGE, TRTLLM_PAGE = synthetic_page("tgi-3x"), synthetic_page("trtllm-serve-2026")
DYNAMO_FRONTEND_PAGE, SGLANG_DP_PAGE = synthetic_page("dynamo-frontend"), synthetic_page("sglang-dp2-tp2-pids")
INFO_PATHS = {a.ENGINE: a.INFO_PATH for a in engines.adapters() if a.INFO_PATH}

EXPECTED = {
    "dynamo-sglang-worker-1req.prom": "dynamo",
    "dynamo-trtllm-worker-2req.prom": "dynamo",
    "llamacpp-server-cpu-load-c8.prom": "llamacpp",
    "sglang-docs-llama31-8b-under-load.prom": "sglang",
    "triton-core-metrics-trtllm-readme.prom": "triton",
    "triton-trtllm-backend-ifb-readme.prom": "triton",
    "triton-trtllm-backend-v1-readme.prom": "triton",
    "vllm-cpu-load-c16.prom": "vllm",
    "vllm-cpu-preempt-during.prom": "vllm",
    "vllm-cpu-rest-fresh.prom": "vllm",
}


def test_every_recorded_page_is_recognised_and_parses() -> None:
    names = sorted(p.name for p in SAMPLES.glob("*.prom"))
    assert set(EXPECTED) <= set(names), "a recording this test knows is gone"
    for name in names:
        text = sample_text(name)
        adapter = engines.detect(text)
        if name in EXPECTED:
            assert adapter.ENGINE == EXPECTED[name], name
        sample = adapter.parse(text, target="t", timestamp=1.0, duration=0.0)
        assert sample.series, f"{name}: no series"


@pytest.mark.parametrize(
    ("page", "engine"),
    [(TGI_PAGE, "tgi"), (TRTLLM_PAGE, "trtllm"), (DYNAMO_FRONTEND_PAGE, "dynamo"), (SGLANG_DP_PAGE, "sglang")],
)
def test_synthetic_pages_are_recognised(page: str, engine: str) -> None:
    assert engines.detect(page).ENGINE == engine


def test_registry_names_and_unknown_engine() -> None:
    assert set(engines.names()) == {"dynamo", "vllm", "sglang", "trtllm", "triton", "tgi", "llamacpp"}
    assert engines.names()[0] == "dynamo"  # a worker page carries another engine's families too
    with pytest.raises(ValueError, match="known: dynamo, vllm"):
        engines.adapter("ollama")


@pytest.mark.parametrize(
    ("page", "says"),
    [
        ('[{"iter": 3, "numActiveRequests": 1}]', "trtllm-serve answers JSON"),
        ("<html><body>404</body></html>", "HTML"),
        ("", "empty page"),
        ("# just a comment\n", "no metric families"),
        ("# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total 3\nprocess_cpu_seconds_total 1\n"
         "ollama:loaded 1\n", "start with: ollama:, process_, python_"),
    ],
)
def test_unknown_page_error_names_what_was_found(page: str, says: str) -> None:
    with pytest.raises(ParseError) as err:
        engines.detect(page)
    assert says in str(err.value)
    assert err.value.reason == "parse"


# --- info endpoints (documents as each engine answers; docs/engines.md "Info endpoints") ---

VLLM_MODELS = {"object": "list", "data": [{"id": "tiny-llama", "object": "model", "owned_by": "vllm",
                                           "root": "/models/tiny-llama", "parent": None, "max_model_len": 2048}]}
SGLANG_SERVER_INFO = {"model_path": "Qwen/Qwen3-0.6B", "tp_size": 2, "dp_size": 1, "context_length": None,
                      "max_running_requests": None, "max_total_num_tokens": 92962, "max_req_input_len": 40954,
                      "internal_states": [{"effective_max_running_requests_per_dp": 2048, "context_length": 40960,
                                           "last_gen_throughput": 0.0}], "version": "0.5.23"}
TGI_INFO = {"model_id": "bigscience/bloom-560m", "model_sha": "e32fd", "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": 128, "max_best_of": 2, "max_stop_sequences": 4, "max_input_tokens": 1024,
            "max_total_tokens": 2048, "validation_workers": 2, "max_client_batch_size": 4, "router": "text-generation-router",
            "version": "3.3.6-dev0", "sha": None, "docker_label": None}
LLAMACPP_PROPS = {"default_generation_settings": {"id": 0, "n_ctx": 1024, "speculative": False},
                  "total_slots": 4, "model_path": "/cache/tiny-llama-f32.gguf", "chat_template": "",
                  "build_info": "b11434"}


@pytest.mark.parametrize(
    ("engine", "doc", "hints"),
    [
        ("vllm", VLLM_MODELS, EngineInfoHints(None, "/models/tiny-llama", 2048, None,
                                              settings={"max_model_len": "2048"})),
        ("sglang", SGLANG_SERVER_INFO, EngineInfoHints(2048, "Qwen/Qwen3-0.6B", 40960, 2, settings={
            "max_running_requests": "2048", "max_total_num_tokens": "92962", "context_length": "40960",
            "tp_size": "2", "dp_size": "1"})),  # null arguments: the effective values SGLang chose
        ("sglang", {**SGLANG_SERVER_INFO, "max_running_requests": 64, "context_length": 8192},
         EngineInfoHints(64, "Qwen/Qwen3-0.6B", 8192, 2, settings={
             "max_running_requests": "64", "max_total_num_tokens": "92962", "context_length": "8192",
             "tp_size": "2", "dp_size": "1"})),
        ("tgi", TGI_INFO, EngineInfoHints(None, "bigscience/bloom-560m", 2048, None, settings={  # admission limit is not the batch cap
            "max_concurrent_requests": "128", "max_input_tokens": "1024", "max_total_tokens": "2048",
            "max_client_batch_size": "4"})),
        ("llamacpp", LLAMACPP_PROPS, EngineInfoHints(4, "/cache/tiny-llama-f32.gguf", 1024, None,
                                                     settings={"total_slots": "4", "n_ctx": "1024"})),
        ("trtllm", {"data": [{"id": "llama-3-8b"}]}, EngineInfoHints(model_id="llama-3-8b")),
        ("dynamo", {"data": []}, EngineInfoHints()),
    ],
)
def test_parse_info(engine: str, doc: object, hints: EngineInfoHints) -> None:
    assert engines.adapter(engine).parse_info(doc) == hints


@pytest.mark.parametrize("doc", [None, "text", 3, [], {"total_slots": True}, {"total_slots": -2}, {"total_slots": "x"}])
def test_parse_info_odd_documents_give_no_hints(doc: object) -> None:
    for adapter in engines.adapters():  # the engine loop hands the adapter whatever JSON the route answered
        assert adapter.parse_info(doc) == EngineInfoHints(), adapter.ENGINE


def test_every_engine_with_a_side_channel_has_an_info_path() -> None:
    assert set(INFO_PATHS) == set(engines.names()) - {"triton"}  # Triton's model config is not an LLM info doc
    assert all(path.startswith("/") for path in INFO_PATHS.values())


# --- the adapter protocol and the registry ---


@pytest.mark.parametrize("engine", engines.names())
def test_every_registered_module_is_an_engine_adapter(engine: str) -> None:
    adapter = engines.adapter(engine)
    assert isinstance(adapter, engines.EngineAdapter) and adapter.ENGINE == engine
    assert adapter.METRICS_PATHS and all(p.startswith("/") for p in adapter.METRICS_PATHS)
    assert adapter.parse_info({"unexpected": ["shape"]}) == EngineInfoHints()


def test_a_module_that_breaks_the_protocol_is_refused() -> None:
    with pytest.raises(TypeError, match="common is not an EngineAdapter .missing: ENGINE, "):
        registry.register("rooflight.collectors.common")
    assert "common" not in engines.names()


def test_auto_probes_metrics_first_then_the_paths_adapters_declare() -> None:
    paths = engines.probe_paths()
    assert paths[0] == "/metrics" and len(set(paths)) == len(paths)
    assert set(paths) == {p for a in engines.adapters() for p in a.METRICS_PATHS} | {"/metrics"}
    assert engines.adapter("trtllm").METRICS_PATHS == ("/prometheus/metrics",)  # its /metrics is JSON
