"""The NVIDIA Dynamo adapter: a frontend's or a worker's `/metrics` page in, one EngineSample out.

Dynamo has two kinds of pages (docs/engines.md "Dynamo"):
- a **worker** (system port, `DYN_SYSTEM_PORT`): `dynamo_component_*` plus the engine's own registry
  passed through (`vllm:*`, `sglang:*`, `trtllm_*`). The engine's adapter reads its families; this
  module adds what only Dynamo says, where the engine said nothing:
  running <- `dynamo_component_inflight_requests` of the `generate` endpoint (1.6 also counts the KV
  router's `worker_kv_query_source_*` queries per endpoint, and drops the `model` label); kv_usage_ratio <-
  `dynamo_component_kvstats_gpu_cache_usage_percent` (a 0..1 ratio despite its name), and
  prefix_cache_hit_ratio <- `kvstats_gpu_prefix_cache_hit_rate` (0..1), only while `kvstats_total_blocks` > 0
  (before the worker publishes KV stats they read 0, which is not an occupancy nor a hit rate; 1.6 exports
  none of them). EngineInfo.labels gets `backend` (the passed-through engine) and `dynamo_component`; a
  component named `prefill` is a disaggregated prefill worker: EngineInfo.role "prefill" (a decode worker's
  page is an aggregated worker's, so it says nothing).
- a **frontend** (`python -m dynamo.frontend`): `dynamo_frontend_*` per `model`, one EngineSeries
  per model (rank "0"): running = `inflight_requests`, waiting = `queued_requests`, batch_max =
  `model_max_num_seqs`, kv_capacity_tokens = `model_total_kv_blocks` x `model_kv_cache_block_size`,
  prompt_tokens_total = `input_sequence_tokens_sum` (all prompt tokens, cache hits included,
  observed per request), generation_tokens_total = `output_tokens_total` (updated in real time),
  ttft / itl = the frontend's histograms (measured at the HTTP edge, so they include routing and
  transport). Not at the frontend, left None: KV occupancy, steps, preemptions. The frontend
  lower-cases `model` on request series but not on the `model_*` gauges: they are joined
  case-insensitively and the gauges' spelling is kept.
A worker page without a known engine's families is read as a frontend page would be (every
engine field None but what Dynamo says), so a bare worker still shows up.

Info endpoint: the frontend's OpenAI `/v1/models` (`data[0].id`); its /metrics carry the rest.
"""

from __future__ import annotations

from dataclasses import replace

from rooflight.collectors import expfmt, registry
from rooflight.collectors import sglang
from rooflight.collectors import trtllm
from rooflight.collectors import vllm
from rooflight.collectors.common import good, has_samples, histogram_names, openai_models_info, read_page
from rooflight.collectors.registry import EngineAdapter
from rooflight.collectors.samples import EngineInfo, EngineSample, EngineSeries

ENGINE = "dynamo"
METRICS_PATHS = ("/metrics",)  # the frontend's port, or the worker's DYN_SYSTEM_PORT
DEFAULT_PATH_NOTE = None
INFO_PATH = "/v1/models"
parse_info = openai_models_info  # data[0].id
ORDER = 10  # first: a worker page carries the passed-through engine's families too
KV_POOL_GROUPED = False  # a pool token holds every layer
SERVICE_FAMILIES = None  # `rooflight rules --engine` and the dashboards read none of its families

# Worker pages: the passed-through engine's column, plus the two overlays in the docstring.
# This is the frontend's column (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`dynamo_frontend_inflight_requests` (worker: the engine's, else `dynamo_component_inflight_requests`)",
    "waiting": "`dynamo_frontend_queued_requests`",
    "batch_max_requests": "`dynamo_frontend_model_max_num_seqs`",
    "kv_usage_ratio": "none at the frontend (worker: the engine's, else `dynamo_component_kvstats_gpu_cache_usage_percent`)",
    "kv_capacity_tokens": "`dynamo_frontend_model_total_kv_blocks` x `dynamo_frontend_model_kv_cache_block_size`",
    "prompt_tokens_total": "`dynamo_frontend_input_sequence_tokens_sum` (cache hits included)",
    "generation_tokens_total": "`dynamo_frontend_output_tokens_total`",
    "steps_total": "none at the frontend (worker: the engine's)",
    "preemptions_total": "none at the frontend (worker: the engine's)",
    "kv_transfer_failures_total": "none at the frontend (worker: the engine's)",
    "ttft": "`dynamo_frontend_time_to_first_token_seconds` (at the HTTP edge)",
    "itl": "`dynamo_frontend_inter_token_latency_seconds`",
    "tensor_parallel_size": "none at the frontend (worker: the engine's)",
    "prefix_cache_hits_total": "none at the frontend (worker: the engine's, else `dynamo_component_kvstats_gpu_prefix_cache_hit_rate`)",
    "prompt_length": "none: not read yet (`dynamo_frontend_input_sequence_tokens` histogram; worker: the engine's)",
    "output_length": "none: not read yet (`dynamo_frontend_output_sequence_tokens` histogram; worker: the engine's)",
    "queue_time": "none at the frontend (worker: the engine's)",
}

PASSED_THROUGH: tuple[EngineAdapter, ...] = (vllm, sglang, trtllm)  # detection order inside a worker page

_F = "dynamo_frontend_"
_C = "dynamo_component_"
GENERATE = "generate"  # the endpoint that serves requests (1.6 adds the router's worker_kv_query_source_*)
PREFILL_COMPONENT = "prefill"  # a disaggregated prefill worker's component (its decode peer's is `backend`)
INFLIGHT = _C + "inflight_requests"
KV_USAGE = _C + "kvstats_gpu_cache_usage_percent"
KV_TOTAL_BLOCKS = _C + "kvstats_total_blocks"
PREFIX_HIT_RATE = _C + "kvstats_gpu_prefix_cache_hit_rate"
F_RUNNING = _F + "inflight_requests"
F_WAITING = _F + "queued_requests"
F_BATCH_MAX = _F + "model_max_num_seqs"
F_KV_BLOCKS = _F + "model_total_kv_blocks"
F_BLOCK_SIZE = _F + "model_kv_cache_block_size"
F_CONTEXT = _F + "model_context_length"
F_PROMPT = _F + "input_sequence_tokens_sum"
F_GENERATION = _F + "output_tokens_total"
F_REQUESTS = _F + "requests_total"
F_TTFT = _F + "time_to_first_token_seconds"
F_ITL = _F + "inter_token_latency_seconds"

NAMES: frozenset[str] = frozenset(
    {
        INFLIGHT,
        KV_USAGE,
        KV_TOTAL_BLOCKS,
        PREFIX_HIT_RATE,
        F_RUNNING,
        F_WAITING,
        F_BATCH_MAX,
        F_KV_BLOCKS,
        F_BLOCK_SIZE,
        F_CONTEXT,
        F_PROMPT,
        F_GENERATION,
        F_REQUESTS,
        *histogram_names(F_TTFT, F_ITL),
    }
)


def recognises(text: str) -> bool:
    """True when the page carries Dynamo's own families (frontend or worker)."""
    return has_samples(text, _F, _C)


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one Dynamo page. ParseError when it holds no Dynamo family read here."""
    exp = read_page(text, ("dynamo_",), NAMES, what="dynamo_frontend_ or dynamo_component_")
    inner = next((m for m in PASSED_THROUGH if m.recognises(text)), None)
    if inner is not None:
        return _worker(exp, inner.parse(text, target=target, timestamp=timestamp, duration=duration), inner.ENGINE)
    if not any(k.startswith(_F) for k in exp.names()):  # a worker whose engine exports nothing here
        models = sorted({s.labels.get("model", "") for s in exp.get(INFLIGHT)})
        bare = EngineSample(target, ENGINE, timestamp, duration, tuple(EngineSeries(model=m) for m in models))
        return _worker(exp, bare, "unknown")
    return EngineSample(
        target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=_frontend(exp),
        info=EngineInfo(labels={"role": "frontend"}),
    )


def _worker(exp: expfmt.Selection, sample: EngineSample, backend: str) -> EngineSample:
    inflight: dict[str, float] = {}
    served = [s for s in exp.get(INFLIGHT) if s.labels.get("dynamo_endpoint") == GENERATE] or exp.get(INFLIGHT)
    for s in served:
        if good(s.value):
            m = s.labels.get("model", "")
            inflight[m.lower()] = inflight.get(m.lower(), 0.0) + s.value  # summed over workers
    total = _last(exp, KV_TOTAL_BLOCKS)
    usage = _last(exp, KV_USAGE) if total else None
    hit_rate = _last(exp, PREFIX_HIT_RATE) if total else None
    series = []
    for s in sample.series:
        series.append(
            replace(
                s,
                running=s.running if s.running is not None else inflight.get(s.model.lower()),
                kv_usage_ratio=s.kv_usage_ratio if s.kv_usage_ratio is not None else usage,
                prefix_cache_hit_ratio=(s.prefix_cache_hit_ratio if s.prefix_cache_hit_ratio is not None
                                        or s.prefix_cache_queries_total is not None else hit_rate),
            )
        )
    component = next((s.labels["dynamo_component"] for s in exp.get(INFLIGHT) if "dynamo_component" in s.labels), None)
    labels = {**sample.info.labels, "role": "worker", "backend": backend}
    if component:
        labels["dynamo_component"] = component
    role = "prefill" if component == PREFILL_COMPONENT else sample.info.role
    return replace(sample, engine=ENGINE, series=tuple(series), info=replace(sample.info, labels=labels, role=role))


def _last(exp: expfmt.Selection, name: str) -> float | None:
    values = [s.value for s in exp.get(name)]
    return values[-1] if values and good(values[-1]) else None


def _by_model(exp: expfmt.Selection, name: str, spelling: dict[str, str]) -> dict[str, float]:
    """lower-cased model -> value summed over other labels; remembers the first spelling seen."""
    out: dict[str, float] = {}
    for s in exp.get(name):
        if not good(s.value):
            continue
        model = s.labels.get("model", "")
        spelling.setdefault(model.lower(), model)
        out[model.lower()] = out.get(model.lower(), 0.0) + s.value
    return out


def _frontend(exp: expfmt.Selection) -> tuple[EngineSeries, ...]:
    spelling: dict[str, str] = {}
    # The model_* gauges first: their spelling (original case) is the one kept.
    gauges = {n: _by_model(exp, n, spelling) for n in (F_BATCH_MAX, F_KV_BLOCKS, F_BLOCK_SIZE, F_CONTEXT)}
    running, waiting = _by_model(exp, F_RUNNING, spelling), _by_model(exp, F_WAITING, spelling)
    prompt, generation = _by_model(exp, F_PROMPT, spelling), _by_model(exp, F_GENERATION, spelling)
    requests = _by_model(exp, F_REQUESTS, spelling)
    key = lambda labels: labels.get("model", "").lower()  # noqa: E731
    ttft, itl = expfmt.histograms(exp, F_TTFT, key), expfmt.histograms(exp, F_ITL, key)
    for m in (*ttft, *itl):
        spelling.setdefault(m, m)
    series = []
    for m in sorted(spelling):
        blocks, size = gauges[F_KV_BLOCKS].get(m), gauges[F_BLOCK_SIZE].get(m)
        extra = {"requests_total": requests[m]} if m in requests else {}
        if m in gauges[F_CONTEXT]:
            extra["context_length_tokens"] = gauges[F_CONTEXT][m]
        series.append(
            EngineSeries(
                model=spelling[m],
                running=running.get(m),
                waiting=waiting.get(m),
                batch_max_requests=gauges[F_BATCH_MAX].get(m),
                kv_capacity_tokens=blocks * size if blocks and size else None,
                prompt_tokens_total=prompt.get(m),
                prompt_tokens_include_cache_hits=m in prompt,  # all prompt tokens, cache hits included
                generation_tokens_total=generation.get(m),
                ttft=ttft.get(m),
                itl=itl.get(m),
                extra=extra,
            )
        )
    return tuple(series)


registry.register(__name__)
