"""How far each target is from its walls, per window: headroom per resource, saturation, the capacity the
roofline leaves at the current mix, cost per million tokens and tokens per joule.

Pure: numbers in, numbers out; the physics is agent/roofline/physics.py, every formula is derived in
docs/physics.md (section Headroom) and listed in docs/metrics.md (section Capacity, cost and energy).

Headroom is 1 at idle and 0 at the wall, so an autoscaler can act on one number:
- kv: 1 - the window's mean KV occupancy (the capacity the running batch at its mean context does not
  need); 0 whenever the window saw a preemption, which an engine does only when the cache ran out.
- batch: 1 - mean running / the batch cap.
- decode_bandwidth: 1 - the window's decode load: its decode tokens/s / what the target decodes at its first
  wall (the batch N = min(batch cap, KV wall) stepping at decode_mbu), so 1 idle and 0 once the batch
  reaches the wall; in an engine that does both phases, plus the prefill load (decode waits while prompts
  run on the same GPU).
- prefill_compute: 1 - prefill MFU / the MFU a real prefill reaches (SignalSettings.prefill_mfu); in an
  engine that does both phases, minus the decode load too (the GPU's seconds are one pool).
- ttft_slo, itl_slo: 1 - the window's p99 / the SLO threshold, where a threshold is set.
Saturation = 1 - the smallest headroom among the resources of the target's role (ROLE_RESOURCES): 1 at
the first wall; `binding` names that resource.
Demand = saturation x (mean running + mean waiting) / mean running: what the binding wall would read if the
queued requests ran too (saturation_demand). Equal to saturation while nothing queues, past 1 once the
queue grows behind the wall, so an autoscaler asks for the pods the queue needs in one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline import physics
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.step import Layout, Prefill, Roofs, Speculation, decode_seconds_per_token, prompt_spans
from rooflight.agent.signals.derive import WindowValues
from rooflight.agent.signals.windows import SeriesHistory, increase

KV, BATCH, DECODE_BANDWIDTH, PREFILL_COMPUTE, TTFT_SLO, ITL_SLO = (
    "kv", "batch", "decode_bandwidth", "prefill_compute", "ttft_slo", "itl_slo")
RESOURCES = (KV, BATCH, DECODE_BANDWIDTH, PREFILL_COMPUTE, TTFT_SLO, ITL_SLO)
ROLES = ("both", "prefill", "decode")
# Which walls a pool scales on: a prefill pool is compute-bound and judged by TTFT; a decode pool is
# bound by its cache, its batch cap and bandwidth, and judged by ITL (docs/physics.md, section Headroom).
ROLE_RESOURCES: Mapping[str, tuple[str, ...]] = {
    "both": RESOURCES,
    "prefill": (PREFILL_COMPUTE, TTFT_SLO),
    "decode": (KV, BATCH, DECODE_BANDWIDTH, ITL_SLO),
}
DEFAULT_PREFILL_MFU = 0.5  # what a strong real prefill reaches (docs/physics.md, section Prefill time)
DEFAULT_DECODE_MBU = 0.7  # a healthy decode's MBU (0.6-0.8, docs/physics.md, section MBU)
ENERGY = "energy_joules"  # the NVML energy counter's name inside a GPU's SeriesHistory


@dataclass(frozen=True, slots=True)
class SignalSettings:
    """What a target's signals need beyond its constants: its role, its SLOs, its GPUs' price, and the
    efficiencies its capacity is predicted at."""

    role: str = "both"
    ttft_slo: float | None = None  # seconds; None: no TTFT headroom
    itl_slo: float | None = None
    gpu_hour_cost: float | None = None  # per GPU per hour, any currency; None: no cost
    prefill_mfu: float = DEFAULT_PREFILL_MFU
    decode_mbu: float = DEFAULT_DECODE_MBU

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ConfigError(f"role {self.role!r}: choose one of {', '.join(ROLES)}")
        for name in ("ttft_slo", "itl_slo", "gpu_hour_cost"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} {value!r}: must be a number above 0")
        for name in ("prefill_mfu", "decode_mbu"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} {getattr(self, name)!r}: must be in (0, 1]")


ENGINE_ROLES: Mapping[str, str] = {  # what engines call their part -> ROLES
    "prefill": "prefill", "kv_producer": "prefill", "producer": "prefill",
    "decode": "decode", "kv_consumer": "decode", "consumer": "decode",
    "both": "both", "kv_both": "both", "null": "both", "none": "both",
}


def role_for(configured: str | None, engine: str | None) -> str:
    """The target's role: the `role` setting, else what the engine's config says (vLLM's kv_role
    kv_producer / kv_consumer / kv_both, SGLang's disaggregation_mode prefill / decode / null), else both."""
    if configured:
        return configured
    return ENGINE_ROLES.get(str(engine or "").strip().lower(), "both")


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the roofline lets this target sustain at the window's prompt/output mix, before its first wall."""

    requests_per_second: float
    decode_tokens_per_second: float  # requests/s x mean output tokens
    phase_tokens_per_second: Mapping[str, float]  # one phase alone: what one pool group of it carries
    batch: float  # the batch at the first wall
    wall: str  # kv or batch (prefill_compute for a prefill-only target)


@dataclass(frozen=True, slots=True)
class WindowSignals:
    window: str
    role: str
    headroom: Mapping[str, float] = field(default_factory=dict)  # by resource, 0..1
    saturation: float | None = None  # 1 - the role's smallest headroom
    binding: str | None = None  # the resource of that smallest headroom
    demand: float | None = None  # saturation x (running + waiting) / running: past 1 with a queue
    capacity: Capacity | None = None
    gpu_time_share: Mapping[str, float] = field(default_factory=dict)  # by phase, adds up to 1
    cost_per_million_tokens: Mapping[str, float] = field(default_factory=dict)  # by phase, its share of the bill
    blended_cost_per_million_tokens: float | None = None  # all tokens, prompt and output
    tokens_per_joule: Mapping[str, float] = field(default_factory=dict)  # by phase, its share of the joules


def kv_headroom(mean_kv_usage: float | None, preemptions_per_second: float | None) -> float | None:
    """1 - mean KV occupancy; 0 when the window preempted (the cache ran out inside it)."""
    if mean_kv_usage is None:
        return None
    if preemptions_per_second:
        return 0.0
    return physics.clamp_unit(1.0 - mean_kv_usage)


def batch_headroom(mean_running: float | None, batch_max: float | None) -> float | None:
    """1 - mean running / batch cap."""
    if mean_running is None or not batch_max:
        return None
    return physics.clamp_unit(1.0 - mean_running / batch_max)


def decode_load(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
                kv_capacity_tokens: float | None, settings: SignalSettings) -> float | None:
    """The window's decode tokens/s / what the target decodes at its first wall (N / step(N), the batch N =
    min(batch cap, KV wall) as capacity finds it): the share of the GPU's seconds this decode work takes when
    the batch is as full as it gets. 0 without decode work; None where the wall is unknown (no model, no GPU
    constants, neither a cache size nor a batch cap)."""
    tokens = w.tokens_per_second.get("decode")
    if tokens is None:
        return None
    if tokens <= 0:
        return 0.0
    wall_step = _decode_at_wall(w, constants, batch_max, kv_capacity_tokens, request_mix(w), settings)
    if wall_step is None:
        return None
    batch, _, step = wall_step
    return tokens * step / batch


def prefill_load(w: WindowValues, prefill_mfu: float) -> float | None:
    """Prefill MFU / the MFU a real prefill reaches: the share of the GPU's seconds the window's prompts take."""
    mfu = w.mfu.get("prefill")
    return None if mfu is None else mfu / prefill_mfu


def gpu_seconds_load(w: WindowValues, decode: float | None, settings: SignalSettings, phase: str) -> float | None:
    """The share of the GPU's seconds `phase`'s wall carries: its own load, plus the other phase's where one
    engine does both. Summed in one order for both phases, so their equal headrooms tie exactly and the
    binding resource is the first in RESOURCES, not whichever rounding came out lower. `decode`: decode_load."""
    prefill = prefill_load(w, settings.prefill_mfu)
    own = decode if phase == "decode" else prefill
    if own is None:
        return None
    if settings.role != "both":
        return own
    return (decode or 0.0) + (prefill or 0.0)


def decode_bandwidth_headroom(w: WindowValues, decode: float | None, settings: SignalSettings) -> float | None:
    """1 - the decode load, plus the prefill load where one engine does both phases: 1 idle, 0 once the batch
    reaches its first wall (decode at the wall's batch fills every second of the GPU). `decode`: decode_load."""
    load = gpu_seconds_load(w, decode, settings, "decode")
    return None if load is None else physics.clamp_unit(1.0 - load)


def prefill_compute_headroom(w: WindowValues, decode: float | None, settings: SignalSettings) -> float | None:
    """1 - prefill MFU / the MFU a real prefill reaches, minus the decode load where one engine does both
    phases (the decode steps take the same GPU's seconds). Held to 0..1: an MFU past the setting is a wall
    already passed, not a negative headroom. `decode`: decode_load."""
    load = gpu_seconds_load(w, decode, settings, "prefill")
    return None if load is None else physics.clamp_unit(1.0 - load)


def slo_headrooms(w: WindowValues, settings: SignalSettings) -> dict[str, float]:
    out = {}
    for resource, key, threshold in ((TTFT_SLO, "ttft", settings.ttft_slo), (ITL_SLO, "itl", settings.itl_slo)):
        observed = w.slo_tail.get(key)
        if threshold is not None and observed is not None:
            out[resource] = physics.slo_headroom(observed, threshold)
    return out


def headrooms(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
              settings: SignalSettings, kv_capacity_tokens: float | None = None) -> dict[str, float]:
    """Every resource's headroom this window can tell, in RESOURCES order."""
    decode = decode_load(w, constants, batch_max, kv_capacity_tokens, settings) if settings.role != "prefill" else None
    found = {
        KV: kv_headroom(w.mean_kv_usage, w.preemptions_per_second),
        BATCH: batch_headroom(w.mean_running, batch_max),
        DECODE_BANDWIDTH: decode_bandwidth_headroom(w, decode, settings),
        PREFILL_COMPUTE: prefill_compute_headroom(w, decode, settings),
        **slo_headrooms(w, settings),
    }
    return {r: found[r] for r in RESOURCES if found.get(r) is not None}  # type: ignore[misc]


def saturation(headroom: Mapping[str, float], role: str) -> tuple[float | None, str | None]:
    """1 - the smallest headroom among the role's resources, and which one; (None, None) when none is known.
    Ties go to the first in RESOURCES order, so the binding resource does not flicker."""
    known = [(headroom[r], r) for r in ROLE_RESOURCES[role] if r in headroom]
    if not known:
        return None, None
    low, resource = min(known, key=lambda item: item[0])
    return 1.0 - low, resource


def saturation_demand(sat: float | None, mean_running: float | None,
                      mean_waiting: float | None) -> float | None:
    """The saturation the binding wall would read if the queued requests ran too: sat x (R + W) / R.

    Every wall of a role grows with the sequences it holds at the window's mix (KV occupancy and the batch
    in proportion, decode and prefill load with the tokens those sequences ask for), so each running
    sequence costs sat / R of the wall and the W waiting behind it would cost W x sat / R more: at the
    batch wall N this is (R + W) / N, at the KV wall (R + W) x context / cache size (docs/physics.md,
    section Demand past the wall). Equal to sat without a queue; sat itself where nothing runs (a
    starting or hung engine: no running sequence to price the queue by; the stall alert's business)."""
    if sat is None:
        return None
    if not mean_waiting or mean_waiting <= 0 or not mean_running or mean_running <= 0:
        return sat
    return sat * (mean_running + mean_waiting) / mean_running


def capacity(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
             kv_capacity_tokens: float | None, settings: SignalSettings) -> Capacity | None:
    """The request rate and decode tokens/s the roofline sustains at the window's mix, before the first wall.

    Mix (request_mix): mean prompt P = prefill tokens/s / requests/s (its computed share: prefix-cache hits
    cost no prefill), mean output O = decode tokens/s / requests/s; in a window that preempted, the finished
    requests' means. First wall: the batch N = min(batch cap, sequences the KV cache holds); the cache holds
    mean running / mean occupancy sequences of the current context (capacity / a sequence's pool tokens at
    P + O/2 while nothing runs). Every second is the step model's (agent/roofline/step.py) at decode_mbu x the
    bandwidth peak and prefill_mfu x the compute peak: a decode step at N (its experts, its draft passes, its
    live KV per sequence, a speculative step's 1 + k verified tokens yielding spec_decode_tokens_per_step), and
    a request's prefill (its computed tokens, its prompt's attention, the LM head once, TP all-reduces); each
    request costs O x step / N + its prefill engine seconds.
    """
    model = _model(constants)
    mix = request_mix(w)
    if model is None or mix is None:
        return None
    layout, roofs = model[0], model[1].at(settings.prefill_mfu, settings.decode_mbu)
    prompt_seconds = prefill_seconds_per_request(w, layout, roofs, mix.computed_prompt)
    prefill_alone = mix.computed_prompt / prompt_seconds if prompt_seconds > 0 else None
    if settings.role == "prefill":
        if mix.computed_prompt <= 0 or prefill_alone is None:
            return None
        sustained = 1.0 / prompt_seconds
        return Capacity(sustained, sustained * mix.output, {"prefill": prefill_alone}, 1.0, PREFILL_COMPUTE)
    wall_step = _decode_at_wall(w, constants, batch_max, kv_capacity_tokens, mix, settings)
    if wall_step is None or mix.output <= 0:
        return None
    batch, wall, step = wall_step
    phases = {"decode": batch / step}
    if settings.role == "both" and prefill_alone is not None:
        phases = {"prefill": prefill_alone, **phases}
    sustained = physics.sustainable_request_rate(mix.computed_prompt, mix.output, batch, step,
                                                 prompt_seconds / mix.computed_prompt if mix.computed_prompt else 0.0,
                                                 prefill=settings.role == "both")
    return Capacity(sustained, sustained * mix.output, phases, batch, wall)


@dataclass(frozen=True, slots=True)
class Mix:
    """A request's mean tokens over a window: its prompt, the part of it the engine computed (prefix-cache hits
    are not), its output."""

    prompt: float
    computed_prompt: float
    output: float


def request_mix(w: WindowValues) -> Mix | None:
    """(mean prompt, its computed part, mean output) tokens per request: prefill and decode tokens/s over
    requests/s (first tokens), or, in a window that preempted, the finished requests' means where the engine
    exports them: a recomputed prompt counts as prefill work again, and over a window shorter than a request's
    life first tokens lag the tokens decoded, so the token mix there reads prompts and outputs several times
    too long. The computed part takes the window's prefix-cache hits out where the engine's counter counts
    them (or, for the finished requests' prompts, always)."""
    hits = w.prefix_cache_hit_ratio or 0.0
    if w.preemptions_per_second and w.finished_mean_prompt_tokens is not None \
            and w.finished_mean_output_tokens is not None:
        prompt = w.finished_mean_prompt_tokens
        return Mix(prompt, prompt * (1.0 - hits), w.finished_mean_output_tokens)
    rate = w.requests_per_second
    if not rate:
        return None
    prompt = w.tokens_per_second.get("prefill", 0.0) / rate
    computed = w.computed_prefill_tokens_per_second
    return Mix(prompt, computed / rate if computed is not None else prompt, w.tokens_per_second.get("decode", 0.0) / rate)


def prefill_seconds_per_request(w: WindowValues, layout: Layout, roofs: Roofs, computed_prompt: float) -> float:
    """Engine seconds one request's prefill takes at these roofs (the step model's FLOPs of its computed tokens,
    their attention at the window's prompt lengths and hit ratio, the LM head once; plus its TP all-reduces);
    the weights are read by the decode steps it rides in, so only its FLOPs count."""
    if computed_prompt <= 0:
        return 0.0
    prefill = Prefill(computed_prompt, prompt_spans(w.prompt_length_mix, w.prefix_cache_hit_ratio), 1.0)
    return layout.prefill_flops(prefill) / roofs.flops + layout.comm_seconds(computed_prompt, roofs.link)


def _decode_at_wall(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
                    kv_capacity_tokens: float | None, mix: Mix | None,
                    settings: SignalSettings) -> tuple[float, str, float] | None:
    """(the batch at the first wall, which wall, the seconds a sequence waits per decoded token there); None
    without peaks or a batch bound."""
    model = _model(constants)
    if model is None:
        return None
    layout, roofs = model
    prompt, output = (mix.prompt, mix.output) if mix is not None else (0.0, 0.0)
    batch, wall, context = _first_wall(w, layout, batch_max, kv_capacity_tokens, prompt + output / 2)
    if batch is None or batch <= 0:
        return None
    step = seconds_per_decoded_token(w, layout, roofs.at(settings.prefill_mfu, settings.decode_mbu), batch, context)
    return (batch, wall, step) if 0.0 < step < math.inf else None


def seconds_per_decoded_token(w: WindowValues, layout: Layout, roofs: Roofs, batch: float, context: float) -> float:
    """The step model's decode step of `batch` sequences holding `context` KV layer-tokens each, at these
    roofs, plus its TP all-reduces, over the tokens it yields each sequence: 1, or under speculative decoding
    spec_decode_tokens_per_step (1 + accepted / drafts) from a step that verifies 1 + k tokens a sequence
    (k = draft tokens / drafts) and runs the draft model k times."""
    return decode_seconds_per_token(layout, roofs, batch, context, Speculation(
        w.spec_decode_draft_length or 0.0, w.spec_decode_tokens_per_step or 1.0, w.draft_passes_per_step))


def _first_wall(w: WindowValues, layout: Layout, batch_max: float | None, kv_capacity_tokens: float | None,
                mix_tokens: float) -> tuple[float | None, str, float]:
    """(the batch at the first wall, which wall, KV layer-tokens per sequence of the current context)."""
    running, usage = w.mean_running, w.mean_kv_usage
    if running and usage and kv_capacity_tokens:  # the engine's own pool: its live KV per running sequence
        kv_batch, context = running / usage, layout.pool_layer_tokens(usage, kv_capacity_tokens) / running
    elif kv_capacity_tokens and mix_tokens > 0:
        kv_batch, context = kv_capacity_tokens / layout.pool_tokens(mix_tokens), layout.layer_tokens(mix_tokens)
    else:  # no cache size known (TGI, llama.cpp): only a batch cap can bound the batch
        context = layout.layer_tokens(mix_tokens)
        return (batch_max, BATCH, context) if batch_max else (None, KV, context)
    if batch_max and batch_max < kv_batch:
        return batch_max, BATCH, context
    return kv_batch, KV, context


def gpu_seconds_by_phase(w: WindowValues, constants: TargetConstants | None,
                         settings: SignalSettings) -> dict[str, float]:
    """Per phase with work in the window, the GPU seconds per second that work takes on the roofline at the
    efficiencies capacity uses (the step model's): prefill = its FLOP/s, as MFU counts them (computed tokens,
    attention, the LM head), over prefill_mfu x the peak; decode = decode tokens/s x step(B) / B at the window's
    mean batch B and mean live KV per sequence (the weights alone where the engine does not say its KV
    occupancy; its draft passes; a speculative step over the tokens it yields). Empty without a model and GPU
    constants."""
    model = _model(constants)
    if model is None:
        return {}
    layout, roofs = model[0], model[1].at(settings.prefill_mfu, settings.decode_mbu)
    out = {}
    prefill_flops = w.flops_per_second.get("prefill")
    if w.tokens_per_second.get("prefill", 0.0) > 0 and prefill_flops:
        out["prefill"] = prefill_flops / roofs.flops
    decode_tokens = w.tokens_per_second.get("decode", 0.0)
    if decode_tokens > 0:
        batch = max(w.mean_running or 0.0, 1.0)
        context = layout.layer_tokens_in(w.mean_live_kv_bytes or 0.0) / batch
        out["decode"] = decode_tokens * seconds_per_decoded_token(w, layout, roofs, batch, context) / batch
    return {phase: s for phase, s in out.items() if 0.0 < s < math.inf}


def gpu_time_share(w: WindowValues, constants: TargetConstants | None, settings: SignalSettings) -> dict[str, float]:
    """Each phase's share of the GPU time the window's work took (docs/physics.md, section Cost and energy per
    phase): 1 for a phase that ran alone; the roofline times' ratio where both ran (no engine the agent reads
    exports its busy time per phase); empty where both ran and the times are not known."""
    working = sorted(phase for phase, tps in w.tokens_per_second.items() if tps > 0)
    if len(working) == 1:
        return {working[0]: 1.0}
    seconds = gpu_seconds_by_phase(w, constants, settings)
    if not working or set(seconds) != set(working):
        return {}
    total = sum(seconds.values())
    return {phase: seconds[phase] / total for phase in working}


def cost_per_million_tokens(w: WindowValues, tp: int, gpu_hour_cost: float | None,
                            share: Mapping[str, float]) -> dict[str, float]:
    """Per phase: $/h per GPU x GPUs (TP) x the phase's share of GPU time / (its tokens/s x 3600 / 1e6); the
    phases' bills add up to the GPU-hour."""
    if gpu_hour_cost is None:
        return {}
    return {phase: physics.cost_per_million_tokens_on(gpu_hour_cost * share[phase], tp, tps)
            for phase, tps in sorted(w.tokens_per_second.items()) if tps > 0 and share.get(phase)}


def blended_cost_per_million_tokens(w: WindowValues, tp: int, gpu_hour_cost: float | None) -> float | None:
    """$/h per GPU x GPUs (TP) / (all tokens/s, prompt and output, x 3600 / 1e6): what a million tokens of the
    current mix cost."""
    tokens = sum(tps for tps in w.tokens_per_second.values() if tps > 0)
    if gpu_hour_cost is None or tokens <= 0:
        return None
    return physics.cost_per_million_tokens_on(gpu_hour_cost, tp, tokens)


def tokens_per_joule(w: WindowValues, share: Mapping[str, float]) -> dict[str, float]:
    """Per phase: the phase's tokens/s / (the target's GPUs' mean power x the phase's share of GPU time)."""
    if not w.energy_watts or w.energy_watts <= 0:
        return {}
    return {phase: physics.tokens_per_joule(tps, w.energy_watts * share[phase])
            for phase, tps in sorted(w.tokens_per_second.items()) if tps > 0 and share.get(phase)}


def window_signals(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
                   kv_capacity_tokens: float | None, settings: SignalSettings) -> WindowSignals:
    cap = capacity(w, constants, batch_max, kv_capacity_tokens, settings)
    room = headrooms(w, constants, batch_max, settings, kv_capacity_tokens)
    sat, binding = saturation(room, settings.role)
    tp = constants.tensor_parallel_size if constants is not None else 1
    share = gpu_time_share(w, constants, settings)
    return WindowSignals(
        window=w.window, role=settings.role, headroom=room, saturation=sat, binding=binding,
        demand=saturation_demand(sat, w.mean_running, w.mean_waiting), capacity=cap,
        gpu_time_share=share,
        cost_per_million_tokens=cost_per_million_tokens(w, tp, settings.gpu_hour_cost, share),
        blended_cost_per_million_tokens=blended_cost_per_million_tokens(w, tp, settings.gpu_hour_cost),
        tokens_per_joule=tokens_per_joule(w, share),
    )


def series_signals(windows: Iterable[WindowValues], constants: TargetConstants | None, batch_max: float | None,
                   kv_capacity_tokens: float | None, settings: SignalSettings) -> tuple[WindowSignals, ...]:
    """One WindowSignals per derived window, in the windows' order."""
    return tuple(window_signals(w, constants, batch_max, kv_capacity_tokens, settings) for w in windows)


def gpu_energy_watts(histories: Iterable[SeriesHistory], seconds: float) -> float | None:
    """Mean power of a target's GPUs over the last `seconds`: each GPU's ENERGY counter increase over its
    own window, divided by that window's length, summed. None unless every GPU reports its energy (a
    partial sum would overstate tokens per joule)."""
    total, any_gpu = 0.0, False
    for history in histories:
        span = history.window(seconds)
        joules = increase(*span, ENERGY) if span else None
        if span is None or joules is None or span[1].t <= span[0].t:
            return None
        total += joules / (span[1].t - span[0].t)
        any_gpu = True
    return total if any_gpu else None


def _model(constants: TargetConstants | None) -> tuple[Layout, Roofs] | None:
    """The target's layout and roofs for the step model; None without a model or for a GPU with no constants on
    file (TargetConstants.gpu None), so what divides by a peak is absent rather than another GPU's."""
    if constants is None or constants.layout is None or constants.roofs is None:
        return None
    return constants.layout, constants.roofs
