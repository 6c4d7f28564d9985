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
    prompt, output = request_mix(w) or (0.0, 0.0)
    wall_step = _decode_at_wall(w, constants, batch_max, kv_capacity_tokens, prompt, output, settings)
    if wall_step is None:
        return None
    batch, _, step = wall_step
    return tokens * step / batch


def prefill_load(w: WindowValues, prefill_mfu: float) -> float | None:
    """Prefill MFU / the MFU a real prefill reaches: the share of the GPU's seconds the window's prompts take."""
    mfu = w.mfu.get("prefill")
    return None if mfu is None else mfu / prefill_mfu


def decode_bandwidth_headroom(w: WindowValues, decode: float | None, settings: SignalSettings) -> float | None:
    """1 - the decode load, plus the prefill load where one engine does both phases: 1 idle, 0 once the batch
    reaches its first wall (decode at the wall's batch fills every second of the GPU). `decode`: decode_load."""
    if decode is None:
        return None
    prefill = prefill_load(w, settings.prefill_mfu) if settings.role == "both" else None
    return physics.clamp_unit(1.0 - decode - (prefill or 0.0))


def prefill_compute_headroom(w: WindowValues, decode: float | None, settings: SignalSettings) -> float | None:
    """1 - prefill MFU / the MFU a real prefill reaches, minus the decode load where one engine does both
    phases (the decode steps take the same GPU's seconds). Held to 0..1: an MFU past the setting is a wall
    already passed, not a negative headroom. `decode`: decode_load."""
    prefill = prefill_load(w, settings.prefill_mfu)
    if prefill is None:
        return None
    return physics.clamp_unit(1.0 - prefill - ((decode or 0.0) if settings.role == "both" else 0.0))


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

    Mix (request_mix): mean prompt P = prefill tokens/s / requests/s, mean output O = decode tokens/s /
    requests/s; in a window that preempted, the finished requests' means.
    First wall: the batch N = min(batch cap, sequences the KV cache holds); the cache holds mean running /
    mean occupancy sequences of the current context (capacity / (P + O/2) while nothing runs). Decode steps
    at N take physics.decode_step_seconds_roofline at decode_mbu x the bandwidth peak and prefill_mfu x the
    compute peak, over the tokens a speculative verify step yields (1 without speculative decoding); each
    request costs O x step / N + P x 2P_active / (peak x prefill_mfu) engine seconds.
    """
    peaks = _peaks(constants)
    mix = request_mix(w)
    if peaks is None or mix is None:
        return None
    prompt, output = mix
    model, flops = constants.model, peaks[0]  # type: ignore[union-attr]
    per_token = physics.prefill_seconds_per_token(model.params_active, flops, settings.prefill_mfu)
    prefill_alone = 1.0 / per_token
    if settings.role == "prefill":
        if prompt <= 0:
            return None
        sustained = physics.sustainable_request_rate(prompt, output, 1.0, 0.0, per_token, decode=False)
        return Capacity(sustained, sustained * output, {"prefill": prefill_alone}, 1.0, PREFILL_COMPUTE)
    wall_step = _decode_at_wall(w, constants, batch_max, kv_capacity_tokens, prompt, output, settings)
    if wall_step is None or output <= 0:
        return None
    batch, wall, step = wall_step
    phases = {"decode": batch / step}
    if settings.role == "both":
        phases = {"prefill": prefill_alone, **phases}
    sustained = physics.sustainable_request_rate(prompt, output, batch, step, per_token,
                                                 prefill=settings.role == "both")
    return Capacity(sustained, sustained * output, phases, batch, wall)


def request_mix(w: WindowValues) -> tuple[float, float] | None:
    """(mean prompt, mean output) tokens per request: prefill and decode tokens/s over requests/s (first
    tokens), or, in a window that preempted, the finished requests' means where the engine exports them: a
    recomputed prompt counts as prefill work again, and over a window shorter than a request's life first
    tokens lag the tokens decoded, so the token mix there reads prompts and outputs several times too long."""
    if w.preemptions_per_second and w.finished_mean_prompt_tokens is not None \
            and w.finished_mean_output_tokens is not None:
        return w.finished_mean_prompt_tokens, w.finished_mean_output_tokens
    rate = w.requests_per_second
    if not rate:
        return None
    return w.tokens_per_second.get("prefill", 0.0) / rate, w.tokens_per_second.get("decode", 0.0) / rate


def _decode_at_wall(w: WindowValues, constants: TargetConstants | None, batch_max: float | None,
                    kv_capacity_tokens: float | None, prompt: float, output: float,
                    settings: SignalSettings) -> tuple[float, str, float] | None:
    """(the batch at the first wall, which wall, the seconds a sequence waits per decoded token there); None
    without peaks or a batch bound. The step is the roofline at decode_mbu x the bandwidth peak and
    prefill_mfu x the compute peak; under speculative decoding it verifies 1 + k tokens a sequence and yields
    spec_decode_tokens_per_step of them (vLLM's 1 + accepted / drafts), so a token costs step / that."""
    peaks = _peaks(constants)
    if peaks is None:
        return None
    batch, wall, kv_seq_tokens = _first_wall(w, batch_max, kv_capacity_tokens, prompt, output)
    if batch is None or batch <= 0:
        return None
    kv_seq = kv_seq_tokens * _kv_bytes_per_token(constants)  # type: ignore[arg-type]
    step = _seconds_per_decoded_token(w, constants, peaks, batch, kv_seq, settings)  # type: ignore[arg-type]
    return (batch, wall, step) if 0.0 < step < math.inf else None


def _seconds_per_decoded_token(w: WindowValues, constants: TargetConstants, peaks: tuple[float, float],
                               batch: float, kv_seq: float, settings: SignalSettings) -> float:
    """The roofline decode step at `batch` (decode_mbu x the bandwidth peak, prefill_mfu x the compute peak)
    over the tokens it yields each sequence: 1, or under speculative decoding spec_decode_tokens_per_step
    (1 + accepted / drafts) from a step that verifies 1 + k tokens a sequence (k = draft tokens / drafts)."""
    model, (flops, bandwidth) = constants.model, peaks
    verified, yielded = 1.0 + (w.spec_decode_draft_length or 0.0), w.spec_decode_tokens_per_step or 1.0
    step = physics.decode_step_seconds_roofline(batch, model.weight_bytes_streamed(batch * verified), kv_seq,  # type: ignore[union-attr]
                                                model.params_active * verified, flops * settings.prefill_mfu,  # type: ignore[union-attr]
                                                bandwidth * settings.decode_mbu)
    return step / max(yielded, 1.0)


def _first_wall(w: WindowValues, batch_max: float | None, kv_capacity_tokens: float | None, prompt: float,
                output: float) -> tuple[float | None, str, float]:
    """(the batch at the first wall, which wall, KV tokens per sequence of the current context)."""
    running, usage = w.mean_running, w.mean_kv_usage
    mix_tokens = prompt + output / 2  # a sequence's mean context over its life at this mix
    if running and usage and kv_capacity_tokens:
        kv_batch, seq_tokens = running / usage, usage * kv_capacity_tokens / running
    elif kv_capacity_tokens and mix_tokens > 0:
        kv_batch, seq_tokens = kv_capacity_tokens / mix_tokens, mix_tokens
    else:  # no cache size known (TGI, llama.cpp): only a batch cap can bound the batch
        return (batch_max, BATCH, mix_tokens) if batch_max else (None, KV, mix_tokens)
    if batch_max and batch_max < kv_batch:
        return batch_max, BATCH, seq_tokens
    return kv_batch, KV, seq_tokens


def gpu_seconds_by_phase(w: WindowValues, constants: TargetConstants | None,
                         settings: SignalSettings) -> dict[str, float]:
    """Per phase with work in the window, the GPU seconds per second that work takes on the roofline at the
    efficiencies capacity uses: prefill = prefill MFU / prefill_mfu (tokens/s x 2P / (peak x prefill_mfu));
    decode = decode tokens/s x step(B) / B at the window's mean batch B and mean live KV per sequence (the
    weights alone where the engine does not say its KV occupancy; step over the tokens a speculative verify
    step yields). Empty without a model and GPU constants."""
    peaks = _peaks(constants)
    if peaks is None:
        return {}
    model, flops = constants.model, peaks[0]  # type: ignore[union-attr]
    out = {}
    prefill_tokens = w.tokens_per_second.get("prefill", 0.0)
    if prefill_tokens > 0:
        out["prefill"] = prefill_tokens * physics.prefill_seconds_per_token(model.params_active, flops,
                                                                           settings.prefill_mfu)
    decode_tokens = w.tokens_per_second.get("decode", 0.0)
    if decode_tokens > 0:
        batch = max(w.mean_running or 0.0, 1.0)
        kv_seq = (w.mean_live_kv_bytes or 0.0) / batch
        step = _seconds_per_decoded_token(w, constants, peaks, batch, kv_seq, settings)  # type: ignore[arg-type]
        out["decode"] = decode_tokens * step / batch
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


def _peaks(constants: TargetConstants | None) -> tuple[float, float] | None:
    """(FLOP/s, bytes/s) of the target's GPUs; None without a model or for a GPU with no constants on file
    (TargetConstants.gpu None), so what divides by a peak is absent rather than another GPU's."""
    if constants is None or constants.model is None:
        return None
    flops, bandwidth = constants.peak_flops, constants.peak_bandwidth
    return None if flops is None or bandwidth is None else (flops, bandwidth)


def _kv_bytes_per_token(constants: TargetConstants) -> float:
    """K+V bytes per token summed over the TP GPUs, as derive.live_kv_bytes counts them."""
    tp = constants.tensor_parallel_size
    return constants.model.kv_bytes_per_token_per_gpu(tp) * tp  # type: ignore[union-attr]
