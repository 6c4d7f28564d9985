"""`rooflight plan`: the serving calculator's command (docs/physics.md), for one model on one GPU type.

The arithmetic is agent/roofline/ (plan.py: the Plan and the pools; physics.py: the formulas); this
module is the command around it: its flags, its text and JSON, and `--from-live`, which reads a
running agent's /metrics over HTTP (the names from the agent's catalog, agent/metrics/names.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.agent.metrics import names as metric_names
from rooflight.agent.roofline.gpus import ALIASES, DEFAULT_PROFILE_KEY, PROFILES, get_profile
from rooflight.agent.roofline.models import PRESETS
from rooflight.agent.roofline.step import Speculation
from rooflight.agent.roofline.plan import (
    DEFAULT_CONTEXT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    Plan,
    PoolPlan,
    batch_context,
    build_plan,
    check_context,
    build_pool_plan,
    group_gpus,
    ms,
    physics_capacities,
    sig,
    within_context,
)
from rooflight.agent.model_files import resolve_model
from rooflight.agent.config import settings
from rooflight.agent.config.values import parse_duration
from rooflight.collectors.common import MAX_BATCH, MAX_CONTEXT_TOKENS, MAX_TENSOR_PARALLEL


def _gb(b: float) -> str:
    return f"{sig(b / 1e9)} GB"


def format_plan(plan: Plan) -> str:
    """Human text: each line is a number and what it means."""
    p = plan
    moe = f" ({sig(p.params_active / 1e9)}B active)" if p.params_active < p.params_total else ""
    lines = [
        f"{p.model} on {p.tp} x {p.gpu}{f' (experts over {p.ep} GPUs)' if p.ep > p.tp else ''}: "
        f"{sig(p.params_total / 1e9)}B params{moe}, "
        f"weights {p.weight_dtype}, KV cache {p.kv_dtype}; context {p.context_tokens:,} tokens, "
        f"batch {p.batch}",
        *([f"Speculative decoding: draft {p.draft_model}, {sig(p.num_speculative_tokens)} tokens proposed a step; "
           f"a decode step verifies {sig(1 + p.num_speculative_tokens)} tokens a sequence, runs the draft "
           f"{sig(p.num_speculative_tokens)} times and keeps {sig(p.decode_tokens_per_step)}: the decode figures "
           "below are its steps"] if p.draft_model else []),
        "",
        "Memory (per GPU unless said)",
        f"  weights                 {_gb(p.weight_bytes)} total, {_gb(p.weight_bytes_per_gpu)} per GPU"
        + (f" (+ {_gb(p.draft_weight_bytes_per_gpu)} of the draft's; its KV is in each sequence's)"
           if p.draft_model else ""),
        f"  KV cache per token      {p.kv_bytes_per_token:,.0f} B ({sig(p.kv_bytes_per_token / 1024)} KiB),"
        " all layers" + (f" (+ {p.draft_kv_bytes_per_token:,.0f} B of the draft's)" if p.draft_model else ""),
        f"  KV cache per sequence   {_gb(p.kv_bytes_per_sequence)} at {p.context_tokens:,} tokens"
        + (", incl. the draft's" if p.draft_model else "")
        + (f" ({p.windowed_layers} of {p.n_layers} layers keep only the last {p.kv_window_tokens:,})"
           if p.windowed_layers else ""),
        f"  KV memory left          {_gb(p.kv_bytes_free_per_gpu)} per GPU ({_gb(p.kv_bytes_free_total)}"
        f" in all), after {_gb(p.reserved_bytes_per_gpu)} reserved for runtime and activations",
    ]
    if p.weight_bytes_streamed_per_step < p.weight_bytes:
        lines.append(f"  weights read a step     {_gb(p.weight_bytes_streamed_per_step)} at batch {p.batch} (the "
                     "input embeddings a row a token; MoE: the experts its tokens touch)")
    if p.fits and p.max_concurrent_sequences >= 1:
        lines.append(f"  max concurrent seqs     {p.max_concurrent_sequences:,.0f} at {p.context_tokens:,}"
                     " tokens each: the batch the KV wall allows")
    elif p.fits:
        lines.append(f"  NO SEQUENCE FITS        one sequence of {p.context_tokens:,} tokens holds "
                     f"{_gb(p.kv_bytes_per_sequence_per_gpu)} of KV per GPU, past the {_gb(p.kv_bytes_free_per_gpu)}"
                     " left: lower --context or raise --tp")
    else:
        memory = p.kv_bytes_free_per_gpu + p.weight_bytes_per_gpu + p.draft_weight_bytes_per_gpu + p.reserved_bytes_per_gpu
        if p.weight_bytes_per_gpu >= memory:
            lines.append("  DOES NOT FIT            the weights alone exceed this GPU's memory: raise --tp")
        elif p.weight_bytes_per_gpu + p.draft_weight_bytes_per_gpu >= memory:
            lines.append(f"  DOES NOT FIT            the draft's {_gb(p.draft_weight_bytes_per_gpu)} ({p.draft_model}) "
                         f"beside {_gb(p.weight_bytes_per_gpu)} of the model's weights per GPU exceed its "
                         f"{_gb(memory)}: give a smaller draft or raise --tp")
        else:  # the weights fit; the reserve takes the rest
            lines.append(f"  DOES NOT FIT            the {_gb(p.reserved_bytes_per_gpu)} reserved (--reserved-gb) leaves"
                         f" no memory for the KV cache beside {_gb(p.weight_bytes_per_gpu)} of weights per GPU, of "
                         f"{_gb(memory)}: lower --reserved-gb or raise --tp")
    lines += [
        "",
        "Roofline",
        f"  ridge point             {sig(p.ridge_point)} FLOP/byte: below it a step waits on memory",
        f"  decode ceiling          {ms(p.decode_step_seconds_weights_only)}/{_per(p)}, "
        f"{sig(p.decode_tokens_per_second_weights_only)} tok/s (batch 1, weights only)",
        f"  decode ceiling at ctx   {ms(p.decode_step_seconds_at_context)}/{_per(p)}, "
        f"{sig(p.decode_tokens_per_second_at_context)} tok/s (batch 1, weights + KV at "
        f"{p.context_tokens:,} tokens)",
        _crossover(p) if p.kv_weight_crossover_tokens is not None else
        "  cache = weights at      never: sliding windows cap one sequence's cache below the weights",
        f"  decode at batch {p.batch:<7} {ms(p.decode_step_seconds_at_batch)}/step, "
        f"{sig(p.decode_tokens_per_second_at_batch)} tok/s in all; intensity "
        f"{sig(p.decode_intensity_at_batch)} FLOP/byte = "
        f"{sig(100 * p.decode_attainable_fraction_of_peak)}% of peak compute at best"
        + (" (on the compute roof)" if p.decode_attainable_fraction_of_peak >= 0.9999 else ""),
    ]
    if p.fits and p.max_concurrent_sequences >= 1 and not p.batch_within_kv_wall:
        lines.append(f"  BEYOND THE KV WALL      {p.batch:,} sequences of {p.context_tokens:,} tokens need "
                     f"{_gb(p.batch * p.kv_bytes_per_sequence_per_gpu)} of KV per GPU, {_gb(p.kv_bytes_free_per_gpu)}"
                     f" left: an engine runs at most {p.max_concurrent_sequences:,.0f} at once, so batch {p.batch:,}"
                     " is memory the GPUs do not have; lower --batch or --context, or raise --tp")
    if p.tp > 1:
        lines.append(f"  TP all-reduce           ~{ms(p.tp_allreduce_seconds_per_token)}/token on {p.link}"
                     " (2 per layer, latency only), on top of the decode step")
        lines.append(f"  with TP at batch {p.batch:<6} {ms(p.decode_step_seconds_at_batch_with_tp)}/step, "
                     f"{sig(p.decode_tokens_per_second_at_batch_with_tp)} tok/s in all (all-reduces "
                     f"{ms(p.tp_allreduce_seconds_at_batch)}: latency + the batch's activations over the link)")
    cross = f"{sig(p.prefill_crossover_tokens)}-token crossover"
    bound = (f"memory-bound: shorter than the {cross}, it waits on reading the weights"
             if p.prefill_memory_bound else f"compute-bound: longer than the {cross}")
    lines += [
        "",
        f"Prefill of {p.prompt_tokens:,} tokens ({bound})",
        f"  work                    {sig(p.prefill_flops / 1e12)} TFLOP, "
        f"{ms(p.prefill_compute_seconds_at_roof)} at peak compute (causal attention "
        f"{sig(p.prefill_attention_flops / 1e12)} TFLOP of it)",
        f"  weight streaming        {ms(p.prefill_weight_seconds)} to read the weights once: the floor "
        f"of any prompt under {sig(p.prefill_crossover_tokens)} tokens",
        f"  time                    {ms(p.prefill_seconds_at_roof)} at the compute roof, "
        f"{ms(p.prefill_seconds)} at {sig(100 * p.prefill_mfu)}% MFU (the longer of compute and "
        "weight streaming)" + (f"; + {ms(p.prefill_tp_allreduce_seconds)} of TP all-reduces" if p.tp > 1 else ""),
        "",
        f"Peaks used: {sig(p.peak_flops / 1e12)} TFLOP/s dense {p.compute_dtype}, "
        f"{sig(p.peak_bandwidth_bytes_per_second / 1e12)} TB/s ({p.tp} GPU{'s' if p.tp > 1 else ''}). "
        "Every figure is a roofline bound; measured MBU/MFU say how close a live engine gets.",
        *(f"Note: {note}" for note in p.notes),
    ]
    return "\n".join(lines)


def _per(p: Plan) -> str:
    """A batch-1 decode step yields a token, or under speculative decoding several: then it is a step."""
    return "step" if p.draft_model else "token"


def _crossover(p: Plan) -> str:
    """The context at which one sequence's cache reads as many bytes as the weights, or why none reaches it."""
    tokens = p.kv_weight_crossover_tokens or 0.0
    if p.max_context_tokens is not None and tokens > p.max_context_tokens:
        return (f"  cache = weights at      never: at {sig(tokens)} tokens, past the {p.max_context_tokens:,} the"
                " model reads (max_position_embeddings)")
    return f"  cache = weights at      {sig(tokens)} tokens of context"


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Every field, base units, for `--json` (null where there is no such number)."""
    return {**dataclasses.asdict(plan), "notes": list(plan.notes)}


def format_catalog() -> str:
    """The model presets and GPU profiles `--model` and `--gpu` accept."""
    lines = ["Model presets (--model):"]
    for key, m in PRESETS.items():
        moe = f", {sig(m.params_active / 1e9)}B active" if m.is_moe else ""
        window = "".join(f", {n}/{m.n_layers} layers keep {w:,} tokens" for w, n in m.window_layers)
        lines.append(f"  {key:<18} {sig(m.params_total / 1e9)}B params{moe}, {m.weight_dtype}, "
                     f"KV {m.kv_bytes_per_token:,.0f} B/token{window}")
    lines.append("GPU profiles (--gpu), dense per-GPU peaks:")
    for key, g in PROFILES.items():
        aliases = sorted(a for a, k in ALIASES.items() if k == key)
        lines.append(f"  {key:<16} {sig(g.peak_flops['bf16'] / 1e12)} TFLOP/s bf16, "
                     f"{sig(g.memory_bandwidth_bytes_per_second / 1e12)} TB/s, {sig(g.memory_bytes / 1e9)} GB,"
                     f" ridge {sig(g.ridge_point)}" + (f" (also {', '.join(aliases)})" if aliases else ""))
    return "\n".join(lines)


def format_pools(p: PoolPlan) -> str:
    source = {"flags": "as given", "physics": "the roofline of the model on its GPUs", "live": "the live agent"}
    said = source.get(p.capacity_source) or "; ".join(  # per phase: "prefill live, decode physics"
        f"{phase} {source.get(src, src)}" for phase, src in
        (part.split(" ", 1) for part in p.capacity_source.split(", ") if " " in part))
    rank_gpus = p.gpus_per_group / p.ranks_per_group
    ep_group = (f", an EP group of {sig(p.ranks_per_group)} ranks of {rank_gpus:,.0f} GPU{'s' if rank_gpus > 1 else ''}"
                if p.ranks_per_group > 1 else "")
    batch = (f"; decode batch {sig(p.decode_batch)}"
             + (f", {sig(p.decode_batch / p.ranks_per_group)} a rank" if p.ranks_per_group > 1 else "")
             if p.decode_batch else "")
    lines = [
        f"Pools for {sig(p.rate)} req/s of {sig(p.prompt_tokens)} prompt + {sig(p.output_tokens)} output tokens"
        f" (p99 TTFT {ms(p.ttft_slo)}, ITL {ms(p.itl_slo)})",
        f"  per group ({p.gpus_per_group} GPU{'s' if p.gpus_per_group > 1 else ''}{ep_group}): "
        f"{sig(p.prefill_capacity_per_group)} prefill tok/s, {sig(p.decode_capacity_per_group)} decode tok/s "
        f"({said}{batch})",
        f"  one group               {sig(p.requests_per_second_per_group)} req/s at this mix; {sig(p.rate)} req/s "
        f"are {sig(p.load_per_group)} groups' work",
        f"  prefill pool            {_groups(p.prefill_groups)} at {_pct(p.prefill_utilization)} busy: "
        f"p99 TTFT within {ms(p.ttft_slo)} ({sig(p.prefill_tokens_per_second)} prompt tok/s / "
        f"{sig(p.prefill_capacity_per_group)} = {sig(p.prefill_tokens_per_second / p.prefill_capacity_per_group)} "
        "groups' work; the rest is room for the queue, which never drains at 100%)",
        f"  decode pool             {_groups(p.decode_groups)} at {_pct(p.decode_utilization)} busy: "
        f"at most 1% of requests wait for one of its {sig(p.decode_slots_per_group)} slots a group "
        f"({sig(p.decode_tokens_per_second)} output tok/s / {sig(p.decode_capacity_per_group)} = "
        f"{sig(p.decode_tokens_per_second / p.decode_capacity_per_group)} groups' work; "
        f"{p.decode_groups_at_full_load:,} at 100%)",
        f"  one shared pool         {_groups(p.shared_groups)} at {_pct(p.shared_utilization)} busy "
        f"({p.shared_groups_at_full_load:,} at 100%)",
    ]
    if p.running_context_tokens is not None:
        lines.append(f"  running context         {p.running_context_tokens:,.0f} tokens a decoding sequence holds on "
                     f"average (P + O (1 + cv^2) / 2 at output cv {sig(p.output_cv or 0.0)}, at most the model's "
                     "context): the physics decode batch's KV")
    if p.kv_bytes_per_request is not None:
        lines.append(f"  KV shipped per request  {_gb(p.kv_bytes_per_request)} (the prompt's cache, prefill to decode)")
    verdict = (f"share one pool of {_groups(p.shared_groups)}" if p.share else
               f"split: {p.prefill_groups:,} prefill + {_groups(p.decode_groups, 'decode group')}")
    lines += ["", f"Verdict: {verdict}", *(f"  - {r}" for r in p.reasons)]
    return "\n".join(lines)


def _pct(ratio: float) -> str:
    return f"{sig(100 * ratio)}%"


def _groups(n: int, what: str = "group") -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


# --- A running agent's signals (`--from-live`) ---

# The agent's families `--from-live` reads (agent/metrics/names.py), by what they give.
LIVE_NAMES = {
    "tokens": metric_names.TOKENS_PER_SECOND, "requests": metric_names.REQUESTS_PER_SECOND, "headroom": metric_names.HEADROOM,
    "saturation": metric_names.SATURATION, "binding": metric_names.SATURATION_BINDING, "capacity": metric_names.CAPACITY_REQUESTS,
    "capacity_decode": metric_names.CAPACITY_DECODE_TOKENS, "capacity_phase": metric_names.CAPACITY_PHASE_TOKENS,
    "capacity_batch": metric_names.CAPACITY_DECODE_BATCH,
    "cost": metric_names.COST_PER_MILLION_TOKENS, "joule": metric_names.TOKENS_PER_JOULE,
    # of each (target, model), no window: the GPUs one copy spans and the model constants the agent used
    "tp": metric_names.TENSOR_PARALLEL_SIZE, "model_info": metric_names.MODEL_INFO,
    "agent": metric_names.BUILD_INFO,  # every agent's page has it: a page with none of these is not an agent's
    # each GPU's constants profile, and which GPUs each target's engine uses
    "gpu_info": metric_names.GPU_INFO, "target_gpu": metric_names.TARGET_GPU_INFO,
}
_MODEL_KINDS = ("tp", "model_info")  # LIVE_NAMES read per (target, model), not per window
_GPU_KINDS = ("gpu_info", "target_gpu")  # ... and per GPU
MAX_LIVE_BYTES = 16 * 1024 * 1024  # read at most this of a page ...
MAX_LIVE_KEPT_BYTES = 4 * 1024 * 1024  # ... and keep at most this of its lines of LIVE_NAMES (an agent: ~1 MB)
_LIVE_CHUNK = 64 * 1024


@dataclass(frozen=True)
class LiveSeries:
    """One (target, engine, model, rank) of a live agent over one window."""

    target: str
    engine: str
    model: str
    rank: str
    window: str
    role: str | None = None
    requests_per_second: float | None = None
    tokens_per_second: dict[str, float] = dataclasses.field(default_factory=dict)
    headroom: dict[str, float] = dataclasses.field(default_factory=dict)
    saturation: float | None = None
    binding: str | None = None
    capacity_requests_per_second: float | None = None
    capacity_decode_tokens_per_second: float | None = None
    capacity_phase_tokens_per_second: dict[str, float] = dataclasses.field(default_factory=dict)
    capacity_decode_batch: float | None = None  # the batch at the agent's first wall: its decode capacity's slots
    capacity_decode_batch_invalid: float | None = None  # that gauge where the page's is no batch (0, NaN, 1e300)
    cost_per_million_tokens: dict[str, float] = dataclasses.field(default_factory=dict)
    tokens_per_joule: dict[str, float] = dataclasses.field(default_factory=dict)
    tensor_parallel_size: int | None = None  # rooflight_tensor_parallel_size of its (target, model)
    model_spec: str | None = None  # rooflight_model_info's spec, config_source and dtypes
    model_source: str | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    gpu_profile: str | None = None  # the constants profile of its GPUs (rooflight_gpu_info), where they share one
    gpu_profiles: tuple[str, ...] = ()  # every profile its GPUs' rooflight_gpu_info names, known to plan or not

    def mix(self) -> tuple[float, float] | None:
        """(mean prompt, mean output) tokens per request: each phase's tokens/s / requests/s; None without a
        positive rate (a hostile page's negative one is no traffic)."""
        if not self.requests_per_second or self.requests_per_second <= 0:
            return None
        r = self.requests_per_second
        return self.tokens_per_second.get("prefill", 0.0) / r, self.tokens_per_second.get("decode", 0.0) / r


def window_seconds(name: str) -> float:
    """A window label ('10s', '1m', '250ms', '1h') in seconds, read as the agent reads its --windows;
    0 for a label that is not a duration."""
    try:
        return parse_duration(name, "window")
    except ConfigError:
        return 0.0


def live_series(text: str, window: str | None = None) -> list[LiveSeries]:
    """Every series' signals over `window` (default: the longest the page has) from an agent's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {v: k for k, v in LIVE_NAMES.items()}
    rows: list[tuple[str, dict[str, str], float]] = []
    models: dict[tuple[str, str], dict[str, Any]] = {}  # (target, model): its TP and model constants
    agent = False
    profiles: dict[str, str] = {}  # GPU uuid (or index): its profile
    target_gpus: dict[str, set[str]] = {}  # target: its GPUs' uuids
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                agent = agent or sample.name in wanted
                if sample.name not in wanted or (not math.isfinite(sample.value)
                                                  and wanted[sample.name] != "capacity_batch"):
                    continue
                kind = wanted[sample.name]
                if kind in _GPU_KINDS and sample.value == 1:
                    gpu = sample.labels.get("uuid") or sample.labels.get("gpu", "")
                    if kind == "gpu_info":
                        profiles[gpu] = sample.labels.get("profile", "")
                    else:
                        target_gpus.setdefault(sample.labels.get("target", ""), set()).add(gpu)
                elif kind in _MODEL_KINDS:
                    _put_model(models.setdefault((sample.labels.get("target", ""), sample.labels.get("model", "")),
                                                 {}), kind, sample.labels, sample.value)
                elif "window" in sample.labels:
                    rows.append((kind, sample.labels, sample.value))
    except (ValueError, TypeError, IndexError, KeyError) as exc:  # prometheus_client's parser raises these
        raise ConfigError(f"--from-live: not a Prometheus text page the agent serves ({type(exc).__name__});"
                          " point it at the agent's /metrics") from None
    if not agent:
        raise ConfigError(f"--from-live: the page has no {metric_names.BUILD_INFO} and none of the agent's signals: "
                          "not a Rooflight agent's /metrics (an engine's?); point it at the agent's (`rooflight run "
                          "--listen`, default 127.0.0.1:9746)")
    windows = {labels["window"] for _, labels, _ in rows}
    if window is not None and window not in windows:
        served = ", ".join(_shown(w) for w in sorted(windows))
        raise ConfigError(f"--window {_shown(window)}: the agent serves {served or 'no windows yet'}")
    chosen = window or max(windows, key=window_seconds, default=None)
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for kind, labels, value in rows:
        if labels["window"] != chosen:
            continue
        key = (labels.get("target", ""), labels.get("engine", ""), labels.get("model", ""), labels.get("rank", ""))
        _put(out.setdefault(key, {}), kind, labels, value)
    return [LiveSeries(*key, window=chosen or "", **fields, **_model_of(models, key[0], key[2]),
                       **_profiles_of(profiles, target_gpus.get(key[0])))
            for key, fields in sorted(out.items())]


def _profiles_of(profiles: dict[str, str], gpus: set[str] | None) -> dict[str, Any]:
    """The constants profiles of a target's GPUs (all the page's where it does not say which are the target's):
    gpu_profile, the one they share where `plan` has it (None where they differ, none is named, or the page names
    a profile `plan` does not have), and gpu_profiles, every one named."""
    found = {profiles.get(g) or "" for g in gpus} if gpus else set(profiles.values())
    one = next(iter(found)) if len(found) == 1 else None
    return {"gpu_profile": one if one in PROFILES else None, "gpu_profiles": tuple(sorted(found))}


def _put_model(fields: dict[str, Any], kind: str, labels: dict[str, str], value: float) -> None:
    if kind == "tp":
        if value == int(value) and 1 <= value <= MAX_TENSOR_PARALLEL:  # a hostile page's 0 or 1e300: not read
            fields["tensor_parallel_size"] = int(value)
    elif value == 1:
        fields.update(model_spec=labels.get("spec"), model_source=labels.get("config_source"),
                      weight_dtype=labels.get("weight_dtype"), kv_dtype=labels.get("kv_dtype"))


def _model_of(models: dict[tuple[str, str], dict[str, Any]], target: str, model: str) -> dict[str, Any]:
    """The (target, model)'s TP and constants; the target's only model row where the names differ."""
    if (target, model) in models:
        return models[(target, model)]
    rows = [fields for (t, _), fields in models.items() if t == target]
    return rows[0] if len(rows) == 1 else {}


def _put(fields: dict[str, Any], kind: str, labels: dict[str, str], value: float) -> None:
    by = {"tokens": ("tokens_per_second", "phase"), "headroom": ("headroom", "resource"),
          "capacity_phase": ("capacity_phase_tokens_per_second", "phase"),
          "cost": ("cost_per_million_tokens", "phase"), "joule": ("tokens_per_joule", "phase")}
    single = {"requests": "requests_per_second", "capacity": "capacity_requests_per_second",
              "capacity_decode": "capacity_decode_tokens_per_second"}
    if kind in by:
        name, label = by[kind]
        fields.setdefault(name, {})[labels.get(label, "")] = value
    elif kind in single:
        fields[single[kind]] = value
    elif kind == "capacity_batch":
        if 1 <= value <= MAX_BATCH:  # a hostile page's 0 or 1e300: not read, and said
            fields["capacity_decode_batch"] = value
        else:
            fields["capacity_decode_batch_invalid"] = value
    elif kind == "saturation":
        fields["saturation"], fields["role"] = value, labels.get("role")
    elif kind == "binding":
        fields["binding"] = labels.get("resource")


def _shown(text: object) -> str:
    """A label value as a terminal may print it: characters that are not printable (escape sequences that
    retitle, clear or rewrite the screen, line breaks that forge lines) are shown as \\xNN / \\uNNNN."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def format_live(series: list[LiveSeries]) -> str:
    """The live signals as text; every label value from the page goes through _shown (the agent may be hostile)."""
    if not series:
        return "The agent serves no windowed signals yet (no engine sampled, or its windows not yet covered)."
    lines = []
    for s in series:
        lines.append(f"{_shown(s.target)} ({_shown(s.engine)}, {_shown(s.model)}, rank {_shown(s.rank)}), window "
                     f"{_shown(s.window)}, role {_shown(s.role or '?')}"
                     + (f", TP {s.tensor_parallel_size}" if s.tensor_parallel_size else ""))
        tps = s.tokens_per_second
        mix = s.mix()
        if s.requests_per_second is not None:
            each = f" ({sig(mix[0])} prompt + {sig(mix[1])} output tokens each)" if mix else ""
            lines.append(f"  now                     {sig(s.requests_per_second)} req/s; "
                         f"{sig(tps.get('prefill', 0.0))} prefill + {sig(tps.get('decode', 0.0))} decode tok/s{each}")
        if s.capacity_requests_per_second is not None:
            alone = ", ".join(f"{sig(v)} {_shown(k)}" for k, v in s.capacity_phase_tokens_per_second.items())
            lines.append(f"  capacity at this mix    {sig(s.capacity_requests_per_second)} req/s, "
                         f"{sig(s.capacity_decode_tokens_per_second or 0.0)} decode tok/s before the first wall"
                         + (f" (one phase alone: {alone} tok/s)" if alone else ""))
        if s.headroom:
            lines.append("  headroom                " + ", ".join(f"{_shown(k)} {v:.2f}" for k, v in s.headroom.items()))
        if s.saturation is not None:
            lines.append(f"  saturation              {s.saturation:.2f} (binding: {_shown(s.binding or '?')})")
        for phase, cost in s.cost_per_million_tokens.items():
            lines.append(f"  cost                    {sig(cost)} per 1M {_shown(phase)} tokens")
        for phase, tpj in s.tokens_per_joule.items():
            lines.append(f"  energy                  {sig(tpj)} {_shown(phase)} tokens per joule")
    return "\n".join(lines)


def fetch_live(url: str, timeout: float = 10.0) -> str:
    """The lines of LIVE_NAMES on the agent's /metrics (at `url`, or `url`/metrics when the URL has no path);
    ConfigError if unreadable.

    Bounded against a hostile server: `timeout` is the deadline of the whole exchange, not of each read
    (a byte every few seconds cannot keep it going), at most MAX_LIVE_BYTES are read, and only the lines
    live_series reads are kept, at most MAX_LIVE_KEPT_BYTES of them. A user:password in the URL is sent as
    basic auth and never printed; a redirect is not followed (it would carry the credentials elsewhere)."""
    import base64
    import http.client
    import socket
    import threading
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ConfigError("--from-live: write the agent's URL, e.g. http://127.0.0.1:9746")
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    shown = urlunsplit((parts.scheme, netloc, path, "", ""))
    headers = {"Accept": "text/plain", "Host": netloc}
    if parts.username is not None:
        token = f"{parts.username}:{parts.password or ''}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(token).decode()
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, port, timeout=timeout)
    expired = threading.Event()

    def expire() -> None:  # the deadline: whatever read is waiting ends now
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", urlunsplit(("", "", path, parts.query, "")), headers=headers)
        response = conn.getresponse()
        if 300 <= response.status < 400:
            raise ConfigError(f"--from-live {shown}: HTTP {response.status}, a redirect; not followed (it could send"
                              " the credentials to another server): give the agent's own URL")
        if response.status != 200:
            raise ConfigError(f"--from-live {shown}: HTTP {response.status}")
        kept = _wanted_lines(response, shown, expired)
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise ConfigError(f"--from-live {shown}: no whole answer within {timeout:g} s") from None
        raise ConfigError(f"--from-live {shown}: cannot read it ({type(exc).__name__})") from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():
        raise ConfigError(f"--from-live {shown}: no whole answer within {timeout:g} s")
    return kept


def _wanted_lines(response: Any, shown: str, expired: Any) -> str:
    """The page's lines that name one of LIVE_NAMES (samples and their # TYPE / # HELP), read a chunk at a time."""
    names = tuple(LIVE_NAMES.values())
    kept: list[bytes] = []
    size = held = 0
    rest = b""
    while not expired.is_set():
        chunk = response.read1(_LIVE_CHUNK)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_LIVE_BYTES:
            raise ConfigError(f"--from-live {shown}: larger than {MAX_LIVE_BYTES // (1024 * 1024)} MiB; not an agent's page")
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            if _names_one_of(line, names):
                held += len(line) + 1
                if held > MAX_LIVE_KEPT_BYTES:
                    raise ConfigError(f"--from-live {shown}: more than {MAX_LIVE_KEPT_BYTES // (1024 * 1024)} MiB of"
                                      " signal lines; not an agent's page")
                kept.append(line)
        if len(rest) > MAX_LIVE_KEPT_BYTES:
            raise ConfigError(f"--from-live {shown}: a line longer than {MAX_LIVE_KEPT_BYTES // (1024 * 1024)} MiB;"
                              " not an agent's page")
    if rest and _names_one_of(rest, names):
        kept.append(rest)
    return b"\n".join(kept).decode("utf-8", errors="replace") + "\n"


def _names_one_of(line: bytes, names: tuple[str, ...]) -> bool:
    text = line[:200].decode("utf-8", errors="replace")
    if text.startswith(("# TYPE ", "# HELP ")):
        text = text[7:]
    for name in names:
        if text.startswith(name) and text[len(name):len(name) + 1] in ("{", " "):
            return True
    return False


def run_capacity(args: argparse.Namespace) -> int:
    """`plan --from-live URL` and/or `plan --rate R`: the live agent's signals, the pools for a rate."""
    if args.from_live and args.rate is None:
        _refuse_roofline_flags(args, "--from-live without --rate reads the live signals alone")
    series = live_series(fetch_live(args.from_live), args.window) if args.from_live else None
    out: dict[str, Any] = {}
    text = []
    if series is not None:
        out["live"] = [dataclasses.asdict(s) for s in series]
        text.append(format_live(series))
    elif args.rate is not None and (args.prefill_capacity is None or args.decode_capacity is None):
        # sizing from the model's physics: the calculator the pools come from, first (not when both are given)
        plan = _calculator(args)
        out["plan"] = plan_to_dict(plan)
        text.append(format_plan(plan))
    if args.rate is not None:
        pools, notes = _pools_for(args, series)
        out["pools"] = {**dataclasses.asdict(pools), "notes": notes}
        text.append("\n".join([format_pools(pools), *(f"Note: {n}" for n in notes)]))
    print(json.dumps(out, indent=2) if args.json else "\n\n".join(text))
    return 0


def _live_for_pools(series: list[LiveSeries] | None) -> LiveSeries | None:
    """The series the pools read: the first with both one-phase capacities, else the first with one (a
    disaggregated agent's own phase), else the first with traffic, else the first."""
    if not series:
        return None
    for ok in (lambda s: {"prefill", "decode"} <= set(s.capacity_phase_tokens_per_second),
               lambda s: bool(s.capacity_phase_tokens_per_second), lambda s: s.mix() is not None):
        found = next((s for s in series if ok(s)), None)
        if found is not None:
            return found
    return series[0]


def _live_model(live: LiveSeries | None) -> Any:
    """The live agent's model as a ModelSpec, where the page names a preset it used (rooflight_model_info's
    config_source preset:KEY); None otherwise (a config.json on the agent's machine is not here to read)."""
    if live is None or not live.model_source or not live.model_source.startswith("preset:"):
        return None
    try:
        return resolve_model(live.model_source.split(":", 1)[1], None, live.weight_dtype, live.kv_dtype)
    except ConfigError:
        return None


def _pools_for(args: argparse.Namespace, series: list[LiveSeries] | None) -> tuple[PoolPlan, list[str]]:
    """The pools for --rate, and notes on where their figures come from: the mix from --prompt/--output, else the
    live one; capacities from the flags, else the live agent's one-phase capacities (a disaggregated agent has its
    own phase's only), else the roofline: of the model on --gpu, or with --from-live of the live agent's model
    (its preset on the page, or --model/--model-config as given), never a model nobody named. A group is the GPUs
    one copy spans, max(tp, ep); its TP is --tp, else the live agent's rooflight_tensor_parallel_size, else 1. A
    live decode capacity's slots are the batch at the agent's first wall (rooflight_capacity_decode_batch_requests),
    stepping every batch / capacity."""
    notes: list[str] = []
    live = _live_for_pools(series)
    where = f"the live agent ({_shown(live.target)}, role {_shown(live.role or '?')})" if live is not None else ""
    others = sorted({_shown(s.target) for s in series or () if live is not None and s.target != live.target})
    if others:
        notes.append(f"the page has other targets too ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}):"
                     f" the pools read {_shown(live.target)} alone (the first in name order with capacities); give "
                     "--prefill-capacity and --decode-capacity to size another")
    mix = live.mix() if live is not None else None
    if mix is not None and not all(math.isfinite(t) and t <= MAX_CONTEXT_TOKENS for t in mix):
        shown = (f"{sig(mix[0])} prompt + {sig(mix[1])} output tokens a request" if all(map(math.isfinite, mix))
                 else "tokens a request past any float")
        raise ConfigError(f"--from-live: {where} shows {shown} "
                          f"(rooflight_tokens_per_second / rooflight_requests_per_second): not a mix any engine "
                          f"serves (at most {MAX_CONTEXT_TOKENS:,} tokens each); give --prompt and --output")
    prompt = args.prompt if args.prompt is not None else (mix[0] if mix and mix[0] > 0 else None)
    output = args.output if args.output is not None else (mix[1] if mix and mix[1] > 0 else None)
    if prompt is None or output is None:
        if series is None:
            raise ConfigError("--rate needs --prompt and --output (mean tokens per request), or --from-live with traffic")
        missing = " and ".join(f for f, v in (("--prompt", prompt), ("--output", output)) if v is None)
        why = ("has no traffic in its window" if mix is None else
               "shows no " + " and no ".join(w for w, v in (("prompt tokens", prompt), ("output tokens", output))
                                             if v is None) + " per request")
        raise ConfigError(f"--rate needs {missing} (mean tokens per request): {where or 'the live agent'} {why}")
    live_tp = live.tensor_parallel_size if live is not None else None
    tp = args.tp if args.tp is not None else (live_tp or 1)
    if args.tp is not None and live_tp and live_tp != args.tp:
        notes.append(f"--tp {args.tp} as given; {where} says its engine spans {live_tp} GPUs "
                     "(rooflight_tensor_parallel_size): the groups are --tp's")
    gpus = group_gpus(tp, args.ep)
    ranks = gpus / tp
    cp, cd = args.prefill_capacity, args.decode_capacity
    sources = {"prefill": "flags" if cp is not None else None, "decode": "flags" if cd is not None else None}
    batch = kv = step = running = None
    phases = live.capacity_phase_tokens_per_second if live is not None else {}
    if cp is None and "prefill" in phases:  # one rank's, as the agent computes it: the EP group runs R of them
        cp, sources["prefill"] = _page_capacity("prefill", phases["prefill"], where) * ranks, "live"
    if cd is None and "decode" in phases:
        cd, sources["decode"] = _page_capacity("decode", phases["decode"], where) * ranks, "live"
        if live is not None and live.capacity_decode_batch:  # its N sequences step every N / C_d (one rank's)
            batch, step = live.capacity_decode_batch * ranks, live.capacity_decode_batch / phases["decode"]
            if step > args.itl_slo:
                notes.append(f"{where}'s decode batch of {sig(live.capacity_decode_batch)} at its first wall steps "
                             f"every {ms(step)} a decoded token, past the {ms(args.itl_slo)} ITL target (--itl-slo): "
                             "the decode pool is sized on the batch it runs, whose streams wait longer than the "
                             "target; a batch cap (vLLM --max-num-seqs) that meets it carries fewer tokens a group")
        else:
            bad = live.capacity_decode_batch_invalid if live is not None else None
            said = (f"an invalid rooflight_capacity_decode_batch_requests ({bad:g}: not a batch of 1 to {MAX_BATCH:,})"
                    if bad is not None else "no rooflight_capacity_decode_batch_requests")
            notes.append(f"{where} exports {said}: decode slots taken as its decode capacity x the ITL target")
    if cp is not None and cd is not None:
        _refuse_roofline_flags(args, "both capacities are " + (
            "given" if sources["prefill"] == sources["decode"] == "flags" else
            "the live agent's" if sources["prefill"] == sources["decode"] else
            f"given or the live agent's ({', '.join(f'{k} {v}' for k, v in sources.items())})"))
    if cp is None or cd is None:
        model, named = _physics_model(args, live, series, [p for p, c in (("prefill", cp), ("decode", cd)) if c is None])
        _check_live_mix(model, args, mix, where)
        gpu, gpu_said = _physics_gpu(args, live, where, notes)
        p_cap, d_cap, d_batch, kv, d_step = physics_capacities(
            model, get_profile(gpu), tp=tp, prompt_tokens=prompt, output_tokens=output,
            batch_max=args.batch_max, prefill_mfu=args.prefill_mfu, decode_mbu=args.decode_mbu,
            reserved_bytes_per_gpu=args.reserved_gb * 1e9, itl_slo=args.itl_slo, ep=args.ep,
            output_cv=args.output_cv or 0.0,
            **_speculative(args, model, (("--prompt + --output", prompt + output),)))
        if named:
            notes.append(f"{' and '.join(p for p, v in sources.items() if v is None)} capacity: the roofline of "
                         f"{named} on {tp} x {gpu} ({gpu_said})")
        if cp is None:
            cp, sources["prefill"] = p_cap, "physics"
        if cd is None:
            cd, sources["decode"], batch, step = d_cap, "physics", d_batch, d_step
            running = batch_context(model, prompt, output, args.output_cv or 0.0)
    source = (sources["prefill"] if sources["prefill"] == sources["decode"]
              else f"prefill {sources['prefill']}, decode {sources['decode']}")
    return build_pool_plan(args.rate, prompt, output, cp, cd, itl_slo=args.itl_slo, ttft_slo=args.ttft_slo,
                           source=str(source), gpus_per_group=gpus, decode_batch=batch, kv_bytes_per_request=kv,
                           decode_step_seconds=step, ranks_per_group=ranks,
                           output_cv=args.output_cv or 0.0 if running is not None else None,
                           running_context_tokens=running), notes


def _check_live_mix(model: Any, args: argparse.Namespace, mix: tuple[float, float] | None, where: str) -> None:
    """ConfigError for a live mix whose request is longer than the model reads, saying it is the page's (a mix of
    --prompt and --output is check_context's, naming them)."""
    if mix is None or (args.prompt is not None and args.output is not None):
        return
    prompt = args.prompt if args.prompt is not None else mix[0]
    output = args.output if args.output is not None else mix[1]
    most = model.max_context_tokens
    if most is not None and prompt + output > most:
        raise ConfigError(f"--from-live: {where} serves {sig(prompt)} prompt + {sig(output)} output tokens a request "
                          f"(the live mix{'' if args.prompt is None and args.output is None else ' with the flag given'}"
                          f"), {sig(prompt + output)} in all, past the {most:,} {model.name} reads "
                          "(max_position_embeddings); give --prompt and --output to size another mix "
                          "(they override the live one)")


# The flags only a roofline capacity reads (the calculator's, or --rate's physics): (flag, attribute)
ROOFLINE_FLAGS = (("--draft-model", "draft_model"), ("--draft-model-config", "draft_model_config"),
                  ("--num-speculative-tokens", "num_speculative_tokens"), ("--draft-acceptance", "draft_acceptance"),
                  ("--gpu", "gpu"), ("--output-cv", "output_cv"))


def _refuse_roofline_flags(args: argparse.Namespace, why: str) -> None:
    """ConfigError naming the roofline's flags given where no roofline is sized (as --num-speculative-tokens
    without a draft is refused): a flag that changes nothing must not look as if it did."""
    given = [flag for flag, key in ROOFLINE_FLAGS if getattr(args, key, None) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} size{'s' if len(given) == 1 else ''} a roofline capacity, and no "
                          f"capacity here is the roofline's: {why}; drop {'it' if len(given) == 1 else 'them'}")


def _page_capacity(phase: str, value: float, where: str) -> float:
    """A live page's one-phase capacity, checked as --prefill-capacity/--decode-capacity are (MIN_CAPACITY to
    MAX_CAPACITY tokens/s): ConfigError saying the page's figure is unusable and which flag replaces it."""
    if not MIN_CAPACITY <= value <= MAX_CAPACITY:
        raise ConfigError(f"--from-live: {where} exports a {phase} capacity of {value:g} tokens/s "
                          f"({metric_names.CAPACITY_PHASE_TOKENS}{{phase=\"{phase}\"}}): unusable, not from "
                          f"{_bound(MIN_CAPACITY)} to {_bound(MAX_CAPACITY)}; give --{phase}-capacity (tokens/s one "
                          "group carries) instead")
    return value


def _physics_model(args: argparse.Namespace, live: LiveSeries | None, series: list[LiveSeries] | None,
                   missing: list[str]) -> tuple[Any, str]:
    """The model whose roofline gives the capacities of the `missing` phases, and its name for the notes ('' when
    the plan printed above names it): --model/--model-config as given; with --from-live, else the live agent's
    model where its page names the preset; else ConfigError saying which phase is missing and its flag."""
    if args.model or args.model_config or series is None:
        model = resolve_model(args.model, args.model_config, args.weight_dtype, args.kv_dtype)
        return model, (f"{model.name} (--model{'-config' if args.model_config else ''})" if series is not None else "")
    model = _live_model(live)
    if model is not None:
        return model.with_dtypes(args.weight_dtype, args.kv_dtype), f"{model.name}, the live agent's model"
    flags = " and ".join(f"--{p}-capacity" for p in missing)
    whose = (f"{live and _shown(live.model_spec or live.model) or 'its model'}"
             f"{f' ({_shown(live.model_source)})' if live and live.model_source else ''}")
    has = (f"{_shown(live.target)} (role {_shown(live.role or '?')}) exports "
           + (" and ".join(sorted(live.capacity_phase_tokens_per_second)) + " capacity only"
              if live.capacity_phase_tokens_per_second else "no capacity")
           if live is not None else "the live agent serves no windowed signals")
    raise ConfigError(f"--from-live: no {' or '.join(missing)} capacity: {has}, and the page names no preset for "
                      f"{whose} to size it on; give {flags} (tokens/s one group carries), or --model/--model-config "
                      "to size it on the roofline")


def _physics_gpu(args: argparse.Namespace, live: LiveSeries | None, where: str, notes: list[str]) -> tuple[str, str]:
    """The GPU profile a physics capacity is sized on, and where it comes from: --gpu as given; else the live
    agent's GPUs' (rooflight_gpu_info); else the default profile."""
    page = live.gpu_profile if live is not None else None
    if args.gpu is not None:
        if page and page != args.gpu:
            notes.append(f"--gpu {args.gpu} as given; {where} runs on {page} (rooflight_gpu_info): the roofline is "
                         "--gpu's")
        return args.gpu, "--gpu"
    if page:
        return page, "the live agent's GPU, rooflight_gpu_info"
    named = live.gpu_profiles if live is not None else ()
    if named:  # never another GPU's peaks unsaid: the page's are unknown to plan, or several
        shown = ", ".join(_shown(n) if n else "(none)" for n in named)
        why = "GPUs of different profiles" if len(named) > 1 else "a GPU profile plan does not know"
        raise ConfigError(f"--from-live: {where} runs on {why} ({shown}, rooflight_gpu_info): give --gpu, the "
                          f"profile to size the missing capacity on (`rooflight plan --list`)")
    return DEFAULT_PROFILE_KEY, "the default --gpu" if live is None else "the default --gpu: the page names no GPU profile"


def _as_given(args: argparse.Namespace, model: Any) -> str:
    """The model as the user named it, with the preset it maps to where that differs
    (meta-llama/Llama-3.1-8B is llama-3-8b's shapes with its own context)."""
    return f"{args.model} ({model.name})" if args.model and args.model != model.name else model.name


def _calculator(args: argparse.Namespace) -> Plan:
    model = resolve_model(args.model, args.model_config, args.weight_dtype, args.kv_dtype)
    context = within_context(model, args.context, DEFAULT_CONTEXT_TOKENS)
    prompt = within_context(model, args.prompt_tokens, DEFAULT_PROMPT_TOKENS)
    return build_plan(model, get_profile(args.gpu or DEFAULT_PROFILE_KEY), tp=args.tp or 1,
                      context_tokens=context, batch=args.batch, prompt_tokens=prompt,
                      prefill_mfu=args.prefill_mfu,
                      reserved_bytes_per_gpu=args.reserved_gb * 1e9, ep=args.ep, named=_as_given(args, model),
                      **_speculative(args, model, (("--context", context), ("--prompt-tokens", prompt))))


MAX_SPECULATIVE_TOKENS = 64  # draft tokens a step: real ones propose 1-10


def _speculative(args: argparse.Namespace, model: Any, lengths: tuple[tuple[str, float], ...]) -> dict[str, Any]:
    """The draft model and its speculation (build_plan's and physics_capacities' `draft`, `speculation`), as
    `rooflight run --draft-model` names it; {} without one. ConfigError naming the flag for a draft without
    --num-speculative-tokens and --draft-acceptance, or those without a draft; for a draft no smaller than
    `model`, of another vocabulary (its proposals are token ids of the model's), or reading fewer tokens than
    `lengths` (flag, tokens)."""
    draft_flags = getattr(args, "draft_model", None), getattr(args, "draft_model_config", None)
    k, acceptance = getattr(args, "num_speculative_tokens", None), getattr(args, "draft_acceptance", None)
    for flag, value in zip(("--draft-model", "--draft-model-config"), draft_flags):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} is empty: write the draft's preset or Hugging Face id (--draft-model) or its "
                              "config.json (--draft-model-config)")
    if not any(draft_flags):
        if k is not None or acceptance is not None:
            raise ConfigError("--num-speculative-tokens and --draft-acceptance describe a draft model's speculation:"
                              " give --draft-model (or --draft-model-config) too, or drop them")
        return {}
    if all(draft_flags):
        raise ConfigError("give --draft-model or --draft-model-config, not both")
    missing = [f for f, v in (("--num-speculative-tokens", k), ("--draft-acceptance", acceptance)) if v is None]
    if missing:
        what = {"--num-speculative-tokens": "the tokens it proposes a step (k, e.g. 4)",
                "--draft-acceptance": "the share of its proposed tokens the model accepts, accepted / proposed (e.g. 0.7; a live "
                                      "agent's rooflight_spec_decode_acceptance_ratio)"}
        raise ConfigError(f"--draft-model needs {' and '.join(missing)}: {'; and '.join(what[f] for f in missing)}")
    if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(f"--num-speculative-tokens {k}: write the draft tokens a step, from 1 to "
                          f"{MAX_SPECULATIVE_TOKENS}")
    try:
        draft = resolve_model(*draft_flags, None, None)
    except ConfigError as e:
        raise ConfigError(f"--draft-model{'-config' if draft_flags[1] else ''}: {e}") from None
    said = f"--draft-model{'-config' if draft_flags[1] else ''} {draft.name}"
    if draft.params_total >= model.params_total:
        raise ConfigError(f"{said}: {sig(draft.params_total / 1e9)}B params, no smaller than {model.name}'s "
                          f"{sig(model.params_total / 1e9)}B: a draft proposes tokens for a larger model to verify; "
                          "give a smaller draft")
    if draft.vocab_size and model.vocab_size and draft.vocab_size != model.vocab_size:
        raise ConfigError(f"{said}: a vocabulary of {draft.vocab_size:,} tokens, {model.name}'s {model.vocab_size:,}:"
                          " its proposals are not the model's tokens; give a draft of the model's tokenizer")
    try:
        check_context(draft, lengths)
    except ConfigError as e:
        raise ConfigError(f"{said}: {e}") from None
    return {"draft": draft, "speculation": Speculation.of(float(k), acceptance)}


# The ranges of `plan`'s real-valued flags: past them the arithmetic overflows (--rate 1e20: math range error in the
# queueing maths) or prints nonsense (--decode-capacity 1e-300: a 300-digit count of groups), so the command
# stops first (exit 2) and says the range. (flag, attribute, low, high, low allowed, what it is)
MIN_RATE = 1e-6  # requests/s: one every eleven days (below, the queueing maths loses its precision)
MAX_RATE = 1e12  # requests/s: far past any fleet (a trillion a second sizes in seconds: tests/agent/roofline/test_erlang.py)
MIN_CAPACITY, MAX_CAPACITY = 1.0, 1e9  # tokens/s one group carries: under one a second, or past a billion, is a typo
MIN_SLO_SECONDS, MAX_SLO_SECONDS = 0.001, 86400.0  # a millisecond (no engine steps faster) to a day
MAX_RESERVED_GB = 10_000.0  # 10 TB on one GPU: none has a tenth of it
_RANGES: tuple[tuple[str, str, float, float, bool, str], ...] = (
    ("--rate", "rate", MIN_RATE, MAX_RATE, True, "requests per second"),
    ("--prompt", "prompt", 1.0, float(MAX_CONTEXT_TOKENS), True, "mean prompt tokens per request"),
    ("--output", "output", 1.0, float(MAX_CONTEXT_TOKENS), True, "mean output tokens per request"),
    ("--prefill-capacity", "prefill_capacity", MIN_CAPACITY, MAX_CAPACITY, True, "prefill tokens/s one group carries"),
    ("--decode-capacity", "decode_capacity", MIN_CAPACITY, MAX_CAPACITY, True, "decode tokens/s one group carries"),
    ("--itl-slo", "itl_slo", MIN_SLO_SECONDS, MAX_SLO_SECONDS, True, "seconds"),
    ("--ttft-slo", "ttft_slo", MIN_SLO_SECONDS, MAX_SLO_SECONDS, True, "seconds"),
    ("--reserved-gb", "reserved_gb", 0.0, MAX_RESERVED_GB, True, "GB per GPU"),
    ("--prefill-mfu", "prefill_mfu", 0.0, 1.0, False, "a fraction of the compute peak"),
    ("--decode-mbu", "decode_mbu", 0.0, 1.0, False, "a fraction of the bandwidth peak"),
    ("--draft-acceptance", "draft_acceptance", 0.0, 1.0, True, "the share of draft tokens accepted"),
    ("--output-cv", "output_cv", 0.0, 10.0, True, "the output lengths' standard deviation / their mean"),
)


def check_flags(args: argparse.Namespace) -> None:
    """ConfigError (exit 2), naming the flag and its range, for a real-valued flag that is not a finite number
    within it; before any arithmetic, so none of them reaches a division by zero or an overflow."""
    for flag, key, low, high, low_ok, what in _RANGES:
        value = getattr(args, key, None)
        if value is None:
            continue
        shown = f"{value:g}" if isinstance(value, float) else repr(value)
        if not math.isfinite(value):
            raise ConfigError(f"{flag} {shown}: not a number; write {what}, e.g. {_example(key)}")
        above = value >= low if low_ok else value > low
        if not above or value > high:
            since = f"from {_bound(low)} to" if low_ok else f"above {_bound(low)} and at most"
            raise ConfigError(f"{flag} {shown}: write {what}, {since} {_bound(high)}")


def _bound(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,g}"


def _example(key: str) -> str:
    return {"rate": "10", "prompt": "1000", "output": "200", "itl_slo": "0.05", "ttft_slo": "0.5",
            "reserved_gb": "4", "draft_acceptance": "0.7", "output_cv": "0.8", "prefill_mfu": "0.5", "decode_mbu": "0.7"}.get(key, "10000")


def run_plan(args: argparse.Namespace) -> int:
    """Entry point of `rooflight plan`; prints text or JSON, returns the exit code."""
    if getattr(args, "list", False):
        print(format_catalog())
        return 0
    check_flags(args)
    if getattr(args, "from_live", None) or getattr(args, "rate", None) is not None:
        return run_capacity(args)
    plan = _calculator(args)
    print(json.dumps(plan_to_dict(plan), indent=2) if args.json else format_plan(plan))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand (func=run_plan)."""
    p = subparsers.add_parser(
        "plan", help="serving calculator: memory, KV capacity, roofline ceilings for a model on a GPU",
        description="Work a model on a GPU through the roofline: how much memory the weights and each "
        "sequence's KV cache take, how many sequences fit, how fast decode can possibly go "
        "(bandwidth-bound) and how long a prefill takes (compute-bound). Bounds, not measurements.")
    settings.add_flags(p, settings.PLAN)  # its flags: agent/config/settings.py and plan_settings.py
    p.set_defaults(func=run_plan)
