"""Serving physics: the roofline, decode and prefill cost, MBU/MFU and KV-cache capacity.

Pure functions of numbers in base units (FLOP, FLOP/s, bytes, bytes/s, seconds, tokens); no I/O and
no knowledge of where the numbers came from. Every formula is derived in docs/physics.md, and every
function has a worked example from there as a test (tests/agent/roofline/test_physics.py).

Peaks are whatever the caller passes. For a model spread over `tp` GPUs, "the peak of the model's
GPUs" is tp x the per-GPU peak (agent/roofline/gpus.py holds per-GPU values): the caller multiplies, and
passes whole-model bytes (weights + KV of all GPUs) against it. Dividing both sides by tp gives the
same ratio, so per-GPU bytes against a per-GPU peak is equally right.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

FLOPS_PER_PARAM_PER_TOKEN = 2.0  # one multiply and one add per weight


def ridge_point(peak_flops: float, peak_bandwidth: float) -> float:
    """FLOPs per byte where the memory roof meets the compute roof (H100 SXM: 989e12/3.35e12 = 295)."""
    return peak_flops / peak_bandwidth


def attainable_flops(intensity: float, peak_flops: float, peak_bandwidth: float) -> float:
    """The roofline: min(peak compute, intensity x bandwidth)."""
    return min(peak_flops, intensity * peak_bandwidth)


def decode_intensity(batch: float, params_active: float, weight_bytes: float,
                     live_kv_bytes: float) -> float:
    """Effective decode FLOPs per byte = B x 2P / (weight_bytes + live KV bytes of the whole batch).

    Weights are shared by the batch; each sequence's cache is its own and is streamed every step.
    """
    return batch * FLOPS_PER_PARAM_PER_TOKEN * params_active / (weight_bytes + live_kv_bytes)


def decode_step_seconds(weight_bytes: float, live_kv_bytes: float, peak_bandwidth: float) -> float:
    """Memory-roof time of one decode step: (weights + live KV) / bandwidth. A lower bound."""
    return (weight_bytes + live_kv_bytes) / peak_bandwidth


def decode_tokens_per_second(batch: float, step_seconds: float) -> float:
    """Aggregate decode throughput: every sequence in the batch gets one token per step."""
    return batch / step_seconds


def compute_seconds(flops: float, peak_flops: float, mfu: float = 1.0) -> float:
    """Time to do `flops` at a fraction `mfu` of peak (1.0 = on the compute roof)."""
    return flops / (peak_flops * mfu)


def prefill_flops(tokens: float, params_active: float) -> float:
    """Forward-pass FLOPs for `tokens` prompt tokens: 2 x params x tokens (attention not modelled)."""
    return FLOPS_PER_PARAM_PER_TOKEN * params_active * tokens


def prefill_seconds(tokens: float, params_active: float, peak_flops: float, mfu: float) -> float:
    """Compute-roof time of a prefill at MFU `mfu` (0.4-0.6 is a strong prefill)."""
    return compute_seconds(prefill_flops(tokens, params_active), peak_flops, mfu)


def mbu(weight_bytes: float, mean_live_kv_bytes: float, steps_per_second: float,
        peak_bandwidth: float) -> float:
    """Model bandwidth utilization: bytes decode must stream per step x steps/s / peak bandwidth."""
    return (weight_bytes + mean_live_kv_bytes) * steps_per_second / peak_bandwidth


def mfu(tokens_per_second: float, params_active: float, peak_flops: float) -> float:
    """Model FLOPs utilization: tokens/s x 2 x active params / peak dense FLOP/s."""
    return tokens_per_second * FLOPS_PER_PARAM_PER_TOKEN * params_active / peak_flops


def kv_bytes_per_sequence(kv_bytes_per_token: float, context_tokens: float) -> float:
    """KV bytes one sequence holds at `context_tokens` (linear in context)."""
    return kv_bytes_per_token * context_tokens


def kv_layer_tokens(context_tokens: float, full_layers: int,
                    windowed_layers: Sequence[tuple[float, int]] = ()) -> float:
    """Layer-tokens one sequence keeps: every full-attention layer keeps all `context_tokens`, a
    sliding-window (or chunked) layer at most its window: full x L + sum(n x min(L, window)).
    Multiply by K+V bytes per layer and token for the sequence's cache."""
    return full_layers * context_tokens + sum(n * min(context_tokens, w) for w, n in windowed_layers)


def attended_tokens(positions: float, window: float = math.inf) -> float:
    """Token pairs the first `positions` tokens of a sequence attend to in one layer under a causal mask:
    sum over j = 1..n of min(j, window), n(n + 1)/2 without a window. A chunk at positions s..e-1 attends
    to attended_tokens(e) - attended_tokens(s) (docs/physics.md, Live ratios)."""
    n = max(positions, 0.0)
    if n <= window:
        return n * (n + 1) / 2
    return window * (window + 1) / 2 + (n - window) * window


def moe_tokens_per_step(prefill_tokens: float | None, decode_tokens: float | None, steps: float | None,
                        scheduled_tokens: float | None = None) -> float | None:
    """Tokens one engine step routes through the experts, over a window: the engine's own count of
    tokens scheduled per step where it keeps one (vLLM's iteration_tokens), else prompt + generated
    tokens per step; never below 1 (a step that ran had a token). None without steps: the window's
    mean running count is not a step's batch (it counts idle time as batch 0)."""
    if not steps or steps <= 0:
        return None
    if scheduled_tokens is not None and scheduled_tokens > 0:
        return max(1.0, scheduled_tokens / steps)
    if prefill_tokens is None and decode_tokens is None:
        return None
    return max(1.0, ((prefill_tokens or 0.0) + (decode_tokens or 0.0)) / steps)


def weight_stream_seconds(weight_bytes: float, peak_bandwidth: float) -> float:
    """Time to read the weights once: the floor of any forward pass, prefill included."""
    return weight_bytes / peak_bandwidth


def prefill_crossover_tokens(weight_bytes: float, params_active: float, peak_flops: float,
                             peak_bandwidth: float) -> float:
    """Prompt length at which prefill compute (2 x P x T / peak) equals reading the weights once
    (W / bandwidth): T = W x peak / (2 x P x bandwidth). Shorter prompts are memory-bound. For
    16-bit weights (W = 2P) this is the ridge point."""
    return weight_bytes * peak_flops / (FLOPS_PER_PARAM_PER_TOKEN * params_active * peak_bandwidth)


def prefill_seconds_bound(tokens: float, params_active: float, peak_flops: float, mfu: float,
                          weight_bytes: float, peak_bandwidth: float) -> float:
    """Prefill time: the longer of the compute (at MFU `mfu`) and reading the weights once."""
    return max(prefill_seconds(tokens, params_active, peak_flops, mfu),
               weight_stream_seconds(weight_bytes, peak_bandwidth))


def max_concurrent_sequences(free_kv_bytes: float, kv_bytes_per_sequence: float) -> float:
    """Whole sequences of that size that fit in the free KV memory (floor; 0 when none fit)."""
    if free_kv_bytes <= 0:
        return 0.0
    return float(math.floor(free_kv_bytes / kv_bytes_per_sequence))


def kv_weight_crossover_tokens(weight_bytes: float, kv_bytes_per_token: float) -> float:
    """Context at which one sequence's cache streams as many bytes as the whole model."""
    return weight_bytes / kv_bytes_per_token


def tensor_parallel_allreduce_seconds(n_layers: int, tp: int, latency_seconds: float) -> float:
    """Per-token TP communication: two all-reduces per layer, each a fixed latency (~5 µs NVLink,
    ~25 µs PCIe); payload bytes are negligible. Zero without tensor parallelism."""
    return 0.0 if tp <= 1 else 2 * n_layers * latency_seconds


def cost_per_million_tokens(gpu_dollars_per_hour: float, tokens_per_second: float) -> float:
    """$ per 1M tokens = $/hour / (tokens/s x 3600 / 1e6)."""
    return gpu_dollars_per_hour / (tokens_per_second * 3600 / 1e6)


def decode_step_seconds_roofline(batch: float, weight_bytes: float, kv_bytes_per_sequence: float,
                                 params_active: float, peak_flops: float, peak_bandwidth: float) -> float:
    """Roofline time of one decode step at batch B: the longer of streaming the weights plus B caches
    ((W + B x KV_seq) / bandwidth) and computing B tokens (B x 2P / peak FLOP/s)."""
    memory = (weight_bytes + batch * kv_bytes_per_sequence) / peak_bandwidth
    compute = batch * FLOPS_PER_PARAM_PER_TOKEN * params_active / peak_flops
    return max(memory, compute)


def decode_tokens_per_second_ceiling(kv_bytes_per_sequence: float, params_active: float, peak_flops: float,
                                     peak_bandwidth: float) -> float:
    """The most decode tokens/s any batch reaches at this context: B / step time as B grows without
    bound, min(bandwidth / KV_seq, peak FLOP/s / 2P); the compute roof alone without a cache."""
    compute = peak_flops / (FLOPS_PER_PARAM_PER_TOKEN * params_active)
    if kv_bytes_per_sequence <= 0:
        return compute
    return min(peak_bandwidth / kv_bytes_per_sequence, compute)


def decode_bandwidth_headroom(batch: float, weight_bytes: float, kv_bytes_per_sequence: float,
                              params_active: float, peak_flops: float, peak_bandwidth: float) -> float | None:
    """1 - (roofline decode tokens/s at batch B) / (the ceiling at any batch at this context), in 0..1.

    The share of this context's decode throughput that more batch can still buy. Memory-bound it is
    W / (W + B x KV_seq): the weights-only step over the step now (1 idle, 0.5 when the caches
    double the step). Without a cache it is 1 - B / B_ridge, the batch left before the step turns
    compute-bound and grows with every sequence (docs/physics.md, section Headroom).

    None where a step or the ceiling is not a positive finite number (a zero model, an infinite KV per
    sequence from an absurd pool): there is no share to tell, and dividing by it raised on every step.
    """
    if batch <= 0:
        return 1.0
    if not (params_active > 0 and peak_flops > 0 and peak_bandwidth > 0):
        return None
    step = decode_step_seconds_roofline(batch, weight_bytes, kv_bytes_per_sequence, params_active,
                                        peak_flops, peak_bandwidth)
    ceiling = decode_tokens_per_second_ceiling(kv_bytes_per_sequence, params_active, peak_flops, peak_bandwidth)
    if not (0.0 < step < math.inf and 0.0 < ceiling < math.inf):
        return None
    share = batch / step / ceiling
    return clamp_unit(1.0 - share) if math.isfinite(share) else None


def clamp_unit(x: float) -> float:
    """x held to 0..1: a headroom below 0 is a wall already passed, above 1 an idle resource."""
    return min(1.0, max(0.0, x))


def slo_headroom(observed_seconds: float, threshold_seconds: float) -> float:
    """1 - observed / threshold in 0..1: 0 once the latency reaches its SLO, 1 at zero latency."""
    return clamp_unit(1.0 - observed_seconds / threshold_seconds)


def prefill_seconds_per_token(params_active: float, peak_flops: float, mfu: float) -> float:
    """Engine seconds one prompt token costs at MFU `mfu`: 2P / (peak x MFU)."""
    return FLOPS_PER_PARAM_PER_TOKEN * params_active / (peak_flops * mfu)


def engine_seconds_per_request(prompt_tokens: float, output_tokens: float, batch: float,
                               decode_step_seconds: float, prefill_seconds_per_prompt_token: float,
                               *, prefill: bool = True, decode: bool = True) -> float:
    """Engine seconds one request costs at a full batch B: O x step(B) / B of decode (each step is
    shared by B sequences) plus P x seconds per prompt token of prefill (prefill and decode run one
    after the other on one GPU); a prefill-only or decode-only engine pays only its own phase."""
    seconds = 0.0
    if decode:
        seconds += output_tokens * decode_step_seconds / batch
    if prefill:
        seconds += prompt_tokens * prefill_seconds_per_prompt_token
    return seconds


def sustainable_request_rate(prompt_tokens: float, output_tokens: float, batch: float,
                             decode_step_seconds: float, prefill_seconds_per_prompt_token: float,
                             *, prefill: bool = True, decode: bool = True) -> float:
    """Requests/s an engine sustains at a full batch B: 1 / engine seconds per request."""
    return 1.0 / engine_seconds_per_request(prompt_tokens, output_tokens, batch, decode_step_seconds,
                                            prefill_seconds_per_prompt_token, prefill=prefill, decode=decode)


def groups_needed(tokens_per_second: float, tokens_per_second_per_group: float) -> int:
    """Whole groups (engine copies) to carry a token rate: ceil(demand / capacity), at least 1.

    A demand within 1e-9 of a whole number of groups counts as that number (100 x 2,000 / 10,000 is 20,
    not 21 by float error)."""
    exact = tokens_per_second / tokens_per_second_per_group
    return max(1, math.ceil(exact - 1e-9 * max(1.0, exact)))


def cost_per_million_tokens_on(gpu_dollars_per_hour: float, gpus: int, tokens_per_second: float) -> float:
    """$ per 1M tokens on `gpus` GPUs at a per-GPU price: $/h x GPUs / (tokens/s x 3600 / 1e6)."""
    return cost_per_million_tokens(gpu_dollars_per_hour * gpus, tokens_per_second)


def tokens_per_joule(tokens_per_second: float, watts: float) -> float:
    """Tokens per joule = tokens/s / W (a watt is a joule per second)."""
    return tokens_per_second / watts


# --- Sizing pools at a latency target (docs/physics.md, section Pools sized at the SLO) ---


EXACT_ERLANG_SERVERS = 2_000  # Erlang B's recursion up to this many servers; the normal approximation past it


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival waits in an M/M/c queue with `servers` and offered load a = rate x service
    time (Erlang C); 1 when a >= c (the queue grows without bound). From Erlang B: its stable recursion up to
    EXACT_ERLANG_SERVERS servers, O(1) past them (erlang_b_normal), so a fleet of 10^12 slots costs what one
    of ten does."""
    if offered_load <= 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    if servers <= EXACT_ERLANG_SERVERS:
        blocking = 1.0
        for k in range(1, servers + 1):
            blocking = offered_load * blocking / (k + offered_load * blocking)
    else:
        blocking = erlang_b_normal(servers, offered_load)
    return servers * blocking / (servers - offered_load * (1.0 - blocking))


def erlang_b_normal(servers: float, offered_load: float) -> float:
    """Erlang B = P(N = c) / P(N <= c) for N ~ Poisson(a), in O(1): P(N = c) by Stirling's series in its
    deviance form (where c ln a - lgamma(c + 1) loses 2% to rounding at 10^12), P(N <= c) = P(Gamma(c + 1) > a)
    by the Wilson-Hilferty cube-root normal approximation. Within 1e-4 of the recursion from 50 servers, 1e-5
    from 1,000 (tests/agent/roofline/test_erlang.py); for c > a."""
    c, a = float(servers), offered_load
    x = (c - a) / a
    log_pmf = -a * ((1.0 + x) * math.log1p(x) - x) - 0.5 * math.log(2.0 * math.pi * c) - 1.0 / (12.0 * c)
    k = c + 1.0
    z = ((a / k) ** (1.0 / 3.0) - 1.0 + 1.0 / (9.0 * k)) * 3.0 * math.sqrt(k)
    below = 0.5 * math.erfc(z / math.sqrt(2.0))
    return min(1.0, math.exp(log_pmf) / below) if below > 0 else 1.0


def mmc_wait_exceeds(servers: int, rate: float, service_seconds: float, wait_seconds: float) -> float:
    """P(queueing wait > t) in M/M/c: C(c, a) x exp(-(c/S - rate) x t); 1 when c <= a."""
    load = rate * service_seconds
    if servers <= load:
        return 1.0
    return erlang_c(servers, load) * math.exp(-(servers / service_seconds - rate) * wait_seconds)


def servers_for_latency(rate: float, service_seconds: float, latency_seconds: float,
                        miss: float = 0.01) -> int | None:
    """The fewest servers for which P(wait + service > latency) <= miss (the p99 at miss 0.01) in M/M/c;
    None when one service alone takes the whole latency budget (no number of servers meets it)."""
    budget = latency_seconds - service_seconds
    if budget <= 0:
        return None
    return fewest_meeting(max(1, math.floor(rate * service_seconds) + 1),
                          lambda c: mmc_wait_exceeds(c, rate, service_seconds, budget) <= miss)


def fewest_meeting(low: int, meets: Callable[[int], bool]) -> int:
    """The smallest integer >= low for which `meets` holds, `meets` false below it and true above it:
    doubling then bisection, so a fleet of thousands of groups costs a few dozen Erlang C evaluations."""
    high = low
    while not meets(high):
        low, high = high + 1, high * 2
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if not meets(mid) else (low, mid)
    return high


def tensor_parallel_allreduce_seconds_at(n_layers: int, tp: int, tokens: float, hidden_size: int,
                                         latency_seconds: float, link_bytes_per_second: float,
                                         activation_bytes: float = 2.0) -> float:
    """TP communication of one forward pass over `tokens` tokens (a decode step's batch, or a prompt):
    two all-reduces per layer, each a fixed latency plus a ring all-reduce's 2 (tp - 1) / tp x payload
    over one GPU's link, payload = tokens x hidden x activation bytes. Zero without tensor parallelism."""
    if tp <= 1:
        return 0.0
    payload = tokens * hidden_size * activation_bytes
    return 2 * n_layers * (latency_seconds + 2 * (tp - 1) / tp * payload / link_bytes_per_second)
