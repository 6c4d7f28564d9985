"""The Hugging Face TGI adapter (3.x router + v2/v3 backends): one `/metrics` page in, one EngineSample out.

TGI renders its metrics with Rust's metrics-exporter-prometheus 0.15 (docs/engines.md "TGI"):
counters keep their registered names, without `_total` (`tgi_batch_inference_count`); histograms
with configured buckets are histograms, the others are *summaries* (quantile lines over a rolling
window); no label names the model or a replica, so one page is one model (series model "" and
rank "0"; the model id comes from `/info`, read by parse_info).

Normalization, true counters only:
- running = `tgi_batch_current_size`, waiting = `tgi_queue_size`;
- kv_capacity_tokens = `tgi_batch_max_total_tokens` (max_batch_total_tokens, the token budget the
  KV cache holds); kv_usage_ratio stays None: TGI exports no occupancy (`current_max_tokens` is the
  running batch's *budget*, kept in extra as `batch_current_max_tokens`, not a used-blocks count);
- prompt_tokens_total = `tgi_request_input_length_sum`, generation_tokens_total =
  `tgi_request_generated_tokens_sum`: cumulative sums of per-request observations (the `_sum` of a
  histogram or summary is a true counter; its quantiles are not). Input lengths are observed when
  a request is validated, generated lengths when it finishes, so both step per request. TGI has no
  prefix-cache accounting, so prompt tokens include any a cache served (prompt_tokens_include_cache_hits:
  the physics marks its prefill MFU as possibly counting hits as work);
- steps_total = sum over `method` of `tgi_batch_inference_count` (one per prefill or decode step);
- not supported, left None: preemptions (none), batch cap (`--max-batch-size` is a launcher flag
  on neither /metrics nor /info), TTFT (TGI has none) and ITL: `tgi_request_mean_time_per_token_duration`
  is a per-request mean that includes the prefill, not an inter-token latency, and where a family
  is a summary its quantiles cover a rolling window of requests that cannot be cut into the
  agent's windows. A summary is never turned into a histogram.
- request histograms (buckets configured by TGI, so true histograms): prompt_length =
  `tgi_request_input_length` (at validation), output_length = `tgi_request_generated_tokens` (at
  finish), queue_time = `tgi_request_queue_duration`; one observation per request. Where one is
  rendered as a summary it is left None, as above.
- prefix cache: none (TGI keeps no prefix-cache accounting).
- extra: `tgi_request_count/success/failure` (requests_*_total), prefill and decode steps apart,
  the per-phase forward time sums (GPU busy seconds by phase, the best busy-time signal of any
  engine) and the batch token budget.
Every counter is also accepted with a `_total` suffix, in case a newer exporter adds it.

Info endpoint: `/info`, `model_id` and `max_total_tokens` (the per-request context).
`max_concurrent_requests` there is the router's admission limit, not the batch cap
(`--max-batch-size` is on neither endpoint), so batch_max_requests stays None. The router
settings in INFO_SETTINGS are kept as settings (3.x: the request limits; 1.x/2.x also the batch
budgets). `--max-batch-prefill-tokens`, the prefill lever, is on neither endpoint in any version.
"""

from __future__ import annotations

import math
from typing import Any

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import (
    MAX_CONTEXT_TOKENS,
    as_dict,
    count,
    good,
    has_families,
    histogram_names,
    nonblank,
    read_page,
)
from rooflight.collectors.samples import EngineInfoHints, EngineSample, EngineSeries, Histogram, settings_from

ENGINE = "tgi"
METRICS_PATHS = ("/metrics",)
DEFAULT_PATH_NOTE = None
INFO_PATH = "/info"
ORDER = 60  # its place in detection and in the coverage table (engines.adapters)
KV_POOL_GROUPED = False  # a pool token holds every layer
SERVICE_FAMILIES = None  # `rooflight rules --engine` and the dashboards read none of its families

# The router settings `/info` states that are kept as settings (the batch budgets are 1.x/2.x only).
INFO_SETTINGS: tuple[str, ...] = (
    "max_concurrent_requests",
    "max_input_tokens",
    "max_total_tokens",
    "max_client_batch_size",
    "max_batch_total_tokens",
    "max_batch_size",
    "max_waiting_tokens",
    "waiting_served_ratio",
)

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`tgi_batch_current_size`",
    "waiting": "`tgi_queue_size`",
    "batch_max_requests": "none: `--max-batch-size` is on neither /metrics nor /info",
    "kv_usage_ratio": "none: TGI exports no KV occupancy",
    "kv_capacity_tokens": "`tgi_batch_max_total_tokens`",
    "prompt_tokens_total": "`tgi_request_input_length_sum` (per request, cache hits included)",
    "generation_tokens_total": "`tgi_request_generated_tokens_sum` (at request end)",
    "steps_total": "sum of `tgi_batch_inference_count` over `method`",
    "preemptions_total": "none: TGI does not report preemption",
    "kv_transfer_failures_total": "none: TGI does not disaggregate prefill and decode",
    "ttft": "none: TGI has no TTFT metric",
    "itl": "none: only a per-request mean incl. prefill (and summaries cannot be windowed)",
    "tensor_parallel_size": "none: shards are a launcher flag",
    "prefix_cache_hits_total": "none: TGI keeps no prefix-cache accounting",
    "prompt_length": "`tgi_request_input_length`",
    "output_length": "`tgi_request_generated_tokens`",
    "queue_time": "`tgi_request_queue_duration`",
}

RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"
KV_CAPACITY = "tgi_batch_max_total_tokens"
PROMPT = "tgi_request_input_length_sum"
GENERATION = "tgi_request_generated_tokens_sum"
STEPS = "tgi_batch_inference_count"
FORWARD_SUM = "tgi_batch_forward_duration_sum"
PROMPT_LENGTH = "tgi_request_input_length"
OUTPUT_LENGTH = "tgi_request_generated_tokens"
QUEUE_TIME = "tgi_request_queue_duration"

# extra key -> counter base name (label-free); read as `name` or `name_total`.
EXTRA_COUNTERS: dict[str, str] = {
    "requests_total": "tgi_request_count",
    "requests_success_total": "tgi_request_success",
    "requests_failure_total": "tgi_request_failure",
}
EXTRA_GAUGES: dict[str, str] = {"batch_current_max_tokens": "tgi_batch_current_max_tokens"}

NAMES: frozenset[str] = frozenset(
    {
        RUNNING,
        WAITING,
        KV_CAPACITY,
        PROMPT,
        GENERATION,
        STEPS,
        STEPS + "_total",
        FORWARD_SUM,
        *histogram_names(PROMPT_LENGTH, OUTPUT_LENGTH, QUEUE_TIME),
        *EXTRA_GAUGES.values(),
        *EXTRA_COUNTERS.values(),
        *(n + "_total" for n in EXTRA_COUNTERS.values()),
    }
)


def recognises(text: str) -> bool:
    """True when the page carries TGI's `tgi_` families."""
    return has_families(text, "tgi_")


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one TGI exposition. ParseError when it holds no `tgi_` family read here."""
    exp = read_page(text, ("tgi_",), NAMES)
    steps = _by_label(exp, STEPS, "method") or _by_label(exp, STEPS + "_total", "method")
    forward = _by_label(exp, FORWARD_SUM, "method")
    extra: dict[str, float] = {}
    for key, name in EXTRA_COUNTERS.items():
        value = _sum(exp, name)
        value = value if value is not None else _sum(exp, name + "_total")
        if value is not None:
            extra[key] = value
    for key, name in EXTRA_GAUGES.items():
        if (value := _sum(exp, name)) is not None:
            extra[key] = value
    for method, value in steps.items():
        extra[f"{method}_steps_total"] = value
    for method, value in forward.items():
        extra[f"{method}_forward_seconds_total"] = value
    series = EngineSeries(
        model="",
        running=_sum(exp, RUNNING),
        waiting=_sum(exp, WAITING),
        kv_capacity_tokens=_sum(exp, KV_CAPACITY),
        prompt_tokens_total=_sum(exp, PROMPT),
        prompt_tokens_include_cache_hits=True,
        generation_tokens_total=_sum(exp, GENERATION),
        steps_total=math.fsum(steps.values()) if steps else None,
        prompt_length=_histogram(exp, PROMPT_LENGTH),
        output_length=_histogram(exp, OUTPUT_LENGTH),
        queue_time=_histogram(exp, QUEUE_TIME),
        extra=extra,
    )
    return EngineSample(target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=(series,))


def _sum(exp: expfmt.Selection, name: str) -> float | None:
    """The sum over label sets of one name (TGI's families here have none, or only `err`)."""
    per = {tuple(sorted(s.labels.items())): s.value for s in exp.get(name)}  # a repeated line: last wins
    values = list(per.values())
    if not values or not all(good(v) for v in values):
        return None
    return math.fsum(values)


def _histogram(exp: expfmt.Selection, base: str) -> Histogram | None:
    """The page's one histogram of that name (TGI labels none of these), or None (absent, a summary)."""
    return expfmt.histograms(exp, base, lambda labels: "").get("")


def _by_label(exp: expfmt.Selection, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in exp.get(name):
        part = s.labels.get(label)
        if part is not None and good(s.value):
            out[part] = s.value
    return out


def parse_info(data: Any) -> EngineInfoHints:
    """Model and context from `/info`; see the module docstring."""
    top = as_dict(data)
    return EngineInfoHints(
        model_id=nonblank(top.get("model_id")),
        max_model_len=count(top.get("max_total_tokens"), MAX_CONTEXT_TOKENS),
        settings=settings_from(top, INFO_SETTINGS),
    )


registry.register(__name__)
