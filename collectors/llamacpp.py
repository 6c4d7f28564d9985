"""The llama.cpp adapter: one `llama-server --metrics` page in, one normalized EngineSample out.

llama-server writes its exposition by hand (docs/engines.md "llama.cpp"): `llamacpp:` counters and
gauges, no labels (only `position` on a per-position spec-decode counter), no histograms, and no
model name. One page is one model (in router mode the agent must scrape `/metrics?model=<id>` per
model), so there is one EngineSeries, model "" and rank "0"; the model's name comes from `/props`
(parse_info), not from here.

Normalization, true counters only:
- running = `requests_processing` (busy slots), waiting = `requests_deferred`;
- prompt_tokens_total = `prompt_tokens_total` (prompt tokens processed, cache hits excluded: the
  computed prefill tokens); generation_tokens_total = `tokens_predicted_total`; both step when a
  prompt / a request finishes, not per decode step, so short windows see them in jumps;
- steps_total = `n_decode_total` (llama_decode() calls);
- prefix cache: hits = `prompt_tokens_cached_total`, queries = hits + `prompt_tokens_total` (which
  excludes them), both per finished prompt; absent on builds without the cached counter;
- never read: `prompt_tokens_seconds` and `predicted_tokens_seconds`. They are averages since the
  previous `/metrics` call of *anyone* (the handler resets its bucket on every scrape), so another
  scraper changes what this one sees; rates come from the counters instead.
- not supported, left None: KV occupancy and capacity (removed upstream in 2025, PR #13660),
  preemptions (llama.cpp does not preempt), batch cap (`/props` total_slots), TTFT and ITL (no
  histograms at all).
- extra: the busy-time counters `prompt_seconds_total` / `tokens_predicted_seconds_total`
  (slot-seconds), `prompt_tokens_cached_total`, the spec-decode counters under the names the vLLM
  adapter uses, `n_tokens_max` (older builds: `n_past_max`, a high-water mark, not a rate), and
  `n_busy_slots_per_decode` (mean busy slots per decode call).
Values that are NaN, infinite or negative are dropped (None).

Info endpoint: `/props`, `total_slots` (= `--parallel`, the batch cap), `model_path` (else
`model_alias`) and `default_generation_settings.n_ctx` (the context per slot); those two are kept
as settings. `--batch-size` / `--ubatch-size` (the prefill lever) are not on `/props`.
"""

from __future__ import annotations

from typing import Any

from rooflight.collectors import expfmt, registry
from rooflight.collectors.common import MAX_CONTEXT_TOKENS, as_dict, count, good, has_families, nonblank, read_page
from rooflight.collectors.samples import EngineInfoHints, EngineSample, EngineSeries, settings_from

ENGINE = "llamacpp"
METRICS_PATHS = ("/metrics",)
DEFAULT_PATH_NOTE = None
INFO_PATH = "/props"
ORDER = 70  # its place in detection and in the coverage table (engines.adapters)
KV_POOL_GROUPED = False  # a pool token holds every layer
SERVICE_FAMILIES = None  # `rooflight rules --engine` and the dashboards read none of its families
INFO_SETTINGS: tuple[str, ...] = ("total_slots", "n_ctx")  # /props and its default_generation_settings

# What each normalized field is read from, or why it is missing (EngineAdapter.COVERAGE).
COVERAGE: dict[str, str] = {
    "running": "`llamacpp:requests_processing`",
    "waiting": "`llamacpp:requests_deferred`",
    "batch_max_requests": "none: not on /metrics (`/props` total_slots)",
    "kv_usage_ratio": "none: removed upstream in 2025 (PR #13660)",
    "kv_capacity_tokens": "none: not exported (`/props` n_ctx is per slot)",
    "prompt_tokens_total": "`llamacpp:prompt_tokens_total` (cache hits excluded; per finished prompt)",
    "generation_tokens_total": "`llamacpp:tokens_predicted_total` (at request end)",
    "steps_total": "`llamacpp:n_decode_total`",
    "preemptions_total": "none: llama.cpp does not preempt",
    "kv_transfer_failures_total": "none: llama.cpp does not disaggregate prefill and decode",
    "ttft": "none: no histograms at all",
    "itl": "none: no histograms at all",
    "tensor_parallel_size": "none: not exported",
    "prefix_cache_hits_total": "`llamacpp:prompt_tokens_cached_total` / (+ `prompt_tokens_total`)",
    "prompt_length": "none: no histograms at all",
    "output_length": "none: no histograms at all",
    "queue_time": "none: no histograms at all",
}

_P = "llamacpp:"
RUNNING = _P + "requests_processing"
WAITING = _P + "requests_deferred"
PROMPT = _P + "prompt_tokens_total"
GENERATION = _P + "tokens_predicted_total"
STEPS = _P + "n_decode_total"
# Read nowhere, on purpose (reset by every scrape): see the module docstring.
SCRAPE_RESET_GAUGES = (_P + "prompt_tokens_seconds", _P + "predicted_tokens_seconds")

# extra key -> wire names, preferred first.
EXTRA_KEYS: dict[str, tuple[str, ...]] = {
    "prompt_seconds_total": (_P + "prompt_seconds_total",),
    "generation_seconds_total": (_P + "tokens_predicted_seconds_total",),
    "prompt_tokens_cached_total": (_P + "prompt_tokens_cached_total",),
    "spec_decode_num_drafts_total": (_P + "spec_decode_num_drafts_total",),
    "spec_decode_num_draft_tokens_total": (_P + "spec_decode_num_draft_tokens_total",),
    "spec_decode_num_accepted_tokens_total": (_P + "spec_decode_num_accepted_tokens_total",),
    "n_tokens_max": (_P + "n_tokens_max", _P + "n_past_max"),
    "busy_slots_per_decode": (_P + "n_busy_slots_per_decode",),
}

NAMES: frozenset[str] = frozenset(
    {RUNNING, WAITING, PROMPT, GENERATION, STEPS, *(n for names in EXTRA_KEYS.values() for n in names)}
)


def recognises(text: str) -> bool:
    """True when the page carries llama-server's `llamacpp:` families."""
    return has_families(text, _P)


def parse(text: str, *, target: str, timestamp: float, duration: float) -> EngineSample:
    """Normalize one llama-server exposition. ParseError when it holds no `llamacpp:` family read here."""
    exp = read_page(text, (_P,), NAMES)
    extra = {key: v for key, names in EXTRA_KEYS.items() if (v := _first(exp, *names)) is not None}
    prompt, cached = _first(exp, PROMPT), extra.get("prompt_tokens_cached_total")
    series = EngineSeries(
        model="",
        running=_first(exp, RUNNING),
        waiting=_first(exp, WAITING),
        prompt_tokens_total=prompt,
        generation_tokens_total=_first(exp, GENERATION),
        steps_total=_first(exp, STEPS),
        prefix_cache_queries_total=prompt + cached if prompt is not None and cached is not None else None,
        prefix_cache_hits_total=cached if prompt is not None else None,
        extra=extra,
    )
    return EngineSample(target=target, engine=ENGINE, timestamp=timestamp, duration=duration, series=(series,))


def _first(exp: expfmt.Selection, *names: str) -> float | None:
    """The value of the first name present (the last sample of it: a repeated line wins), if sane."""
    for name in names:
        samples = [s for s in exp.get(name) if not s.labels]
        if samples:
            value = samples[-1].value
            return value if good(value) else None
    return None


def parse_info(data: Any) -> EngineInfoHints:
    """Batch cap, model and per-slot context from `/props`; see the module docstring."""
    top = as_dict(data)
    slots = count(top.get("total_slots"))
    n_ctx = count(as_dict(top.get("default_generation_settings")).get("n_ctx"), MAX_CONTEXT_TOKENS)
    return EngineInfoHints(
        batch_max_requests=slots,
        model_id=nonblank(top.get("model_path")) or nonblank(top.get("model_alias")),
        max_model_len=n_ctx,
        settings=settings_from({"total_slots": slots, "n_ctx": n_ctx}, INFO_SETTINGS),
    )


registry.register(__name__)
