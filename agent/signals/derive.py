"""From one series' history and its target's constants to the windowed numbers the agent exports.

Pure: no I/O, no clock. Each window is computed from the first and last of the agent's own samples
inside it (see windows.py), so every value is over the real time between two real samples.

A utilization above MAX_UTILIZATION is not a measurement but a sign that an input is wrong (a counter
the engine corrupts, a model or GPU that is not the one serving): it is withheld, and its reason
listed in `WindowValues.dropped` for the caller to count. Above 1 and not at 1, because the constants
are nominal (a GPU's datasheet peak, the model's bytes without activations) and a short window's
steps can bunch up: a real engine near its roof can read a little over 1.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping

from rooflight.agent.roofline import physics
from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.step import Decode, Lengths, Prefill, Step, prompt_spans
from rooflight.agent.signals.windows import (
    CorrectedHistogram, Point, SeriesHistory, histogram_delta, histogram_quantiles, increase,
    mean, rate,
)
from rooflight.collectors.samples import EngineSeries, Histogram

# Names inside a SeriesHistory.
PROMPT, GENERATION, STEPS, PREEMPTIONS = "prompt_tokens", "generation_tokens", "steps", "preemptions"
RUNNING, WAITING, KV_USAGE = "running", "waiting", "kv_usage"
DRAFT, ACCEPTED = "spec_draft_tokens", "spec_accepted_tokens"
DRAFTS = "spec_drafts"  # speculative proposals (one per sequence and step that drafted)
KV_TRANSFER = "kv_transfer_tokens"  # prompt tokens whose KV arrived from another instance (vLLM's KV connector)
# SGLang's KV transfers (disaggregated): the last transfer's latency (ms) and speed (GB/s) as gauges, or
# as histograms whose sums and counts are kept as counters (collectors/sglang.py).
KV_TRANSFER_MS, KV_TRANSFER_GBPS = "kv_transfer_latency_ms", "kv_transfer_speed_gb_s"
KV_TRANSFER_MS_SUM, KV_TRANSFER_MS_COUNT = "kv_transfer_latency_ms_sum", "kv_transfer_latency_ms_count"
KV_TRANSFER_GBPS_SUM, KV_TRANSFER_GBPS_COUNT = "kv_transfer_speed_gb_s_sum", "kv_transfer_speed_gb_s_count"
TTFT, ITL = "ttft", "itl"
PREFIX_QUERIES, PREFIX_HITS = "prefix_cache_queries", "prefix_cache_hits"  # prompt tokens looked up / found
PREFIX_HIT_RATIO = "prefix_cache_hit_ratio"  # the engine's own gauge, where it keeps no counters
PROMPT_LENGTH_SUM, PROMPT_LENGTH_COUNT = "prompt_length_sum", "prompt_length_count"  # its histogram's
ITERATION_TOKENS = "iteration_tokens"  # tokens the engine scheduled, summed over its steps (vLLM)
STEP_TOKENS = "step_tokens"  # the histogram of tokens per step (vLLM): head-of-line's largest step
# 1 while the engine's prompt counter counts prefix-cache hits as prompt tokens (EngineSeries)
PROMPT_INCLUDES_HITS = "prompt_includes_cache_hits"
PROMPT_LENGTH, OUTPUT_LENGTH, QUEUE_TIME = "prompt_length", "output_length", "queue_time"  # per request
# Those two histograms' sums and counts, kept as counters: the finished requests' mean prompt and output.
FINISHED, FINISHED_PROMPT, FINISHED_OUTPUT = "finished_requests", "finished_prompt_tokens", "finished_output_tokens"

MAX_UTILIZATION = 1.2  # MBU and MFU above this are withheld (see the module docstring)
SLO_QUANTILE = 0.99  # the tail the SLO headroom judges (signals/headroom.py), whatever percentiles are exported
MBU_OUT_OF_RANGE, MFU_OUT_OF_RANGE = "mbu_out_of_range", "mfu_out_of_range"  # reasons in WindowValues.dropped


def history_inputs(
    series: EngineSeries,
) -> tuple[dict[str, float | None], dict[str, float | None], dict[str, Histogram | None]]:
    """What of one engine series goes into its history: counters, gauges, histograms."""
    counters = {
        PROMPT: series.prompt_tokens_total,
        GENERATION: series.generation_tokens_total,
        STEPS: series.steps_total,
        PREEMPTIONS: series.preemptions_total,
        DRAFT: series.extra.get("spec_decode_num_draft_tokens_total"),
        DRAFTS: series.extra.get("spec_decode_num_drafts_total"),
        ITERATION_TOKENS: series.extra.get("iteration_tokens_sum"),
        PROMPT_LENGTH_SUM: series.prompt_length.sum if series.prompt_length else None,
        PROMPT_LENGTH_COUNT: series.prompt_length.count if series.prompt_length else None,
        ACCEPTED: series.extra.get("spec_decode_num_accepted_tokens_total"),
        KV_TRANSFER: series.extra.get("prompt_tokens_external_kv_transfer_total"),
        KV_TRANSFER_MS_SUM: series.extra.get("kv_transfer_latency_ms_sum_total"),
        KV_TRANSFER_MS_COUNT: series.extra.get("kv_transfer_latency_ms_count_total"),
        KV_TRANSFER_GBPS_SUM: series.extra.get("kv_transfer_speed_gb_s_sum_total"),
        KV_TRANSFER_GBPS_COUNT: series.extra.get("kv_transfer_speed_gb_s_count_total"),
        PREFIX_QUERIES: series.prefix_cache_queries_total,
        PREFIX_HITS: series.prefix_cache_hits_total,
        FINISHED: _count(series.prompt_length) if _count(series.output_length) is not None else None,
        FINISHED_PROMPT: _sum(series.prompt_length),
        FINISHED_OUTPUT: _sum(series.output_length),
    }
    gauges = {RUNNING: series.running, WAITING: series.waiting, KV_USAGE: series.kv_usage_ratio,
              PREFIX_HIT_RATIO: series.prefix_cache_hit_ratio,
              PROMPT_INCLUDES_HITS: 1.0 if series.prompt_tokens_include_cache_hits else None,
              KV_TRANSFER_MS: series.extra.get("kv_transfer_latency_ms"),
              KV_TRANSFER_GBPS: series.extra.get("kv_transfer_speed_gb_s")}
    histograms = {TTFT: series.ttft, ITL: series.itl, PROMPT_LENGTH: series.prompt_length,
                  OUTPUT_LENGTH: series.output_length, QUEUE_TIME: series.queue_time, STEP_TOKENS: series.step_tokens}
    return counters, gauges, histograms


@dataclass(frozen=True, slots=True)
class WindowValues:
    """Everything derived over one window. Absent keys and None mean "cannot be derived here"."""

    window: str
    seconds: float
    tokens_per_second: Mapping[str, float] = field(default_factory=dict)  # by phase
    steps_per_second: float | None = None
    preemptions_per_second: float | None = None
    mbu: float | None = None
    mfu: Mapping[str, float] = field(default_factory=dict)  # by phase
    # The numerators of MBU and MFU: bytes the engine's steps read per second, and FLOP/s by phase, as the
    # ratios count them (absent where the model is unknown, or where the ratio was withheld as impossible).
    streamed_bytes_per_second: float | None = None
    flops_per_second: Mapping[str, float] = field(default_factory=dict)
    decode_intensity: float | None = None
    ttft: Mapping[str, float] = field(default_factory=dict)  # by percentile
    itl: Mapping[str, float] = field(default_factory=dict)  # by percentile
    mean_running: float | None = None
    mean_waiting: float | None = None  # requests queued for admission, time-weighted (headroom.saturation_demand)
    mean_kv_usage: float | None = None
    mean_live_kv_bytes: float | None = None
    prefill_tokens_per_step: float | None = None
    dram_utilization: float | None = None  # measured on the target's GPUs (GPM), same window
    spec_decode_acceptance: float | None = None  # accepted / proposed draft tokens
    spec_decode_tokens_per_step: float | None = None  # 1 + accepted / drafts: tokens a sequence gets a verify step
    spec_decode_draft_length: float | None = None  # draft tokens / drafts: k, the tokens a verify step checks - 1
    # The requests that finished in the window (vLLM's request_prompt_tokens / request_generation_tokens):
    # their mean prompt and output tokens, unlike tokens/s over first tokens/s free of re-prefills.
    finished_requests_per_second: float | None = None
    finished_mean_prompt_tokens: float | None = None
    finished_mean_output_tokens: float | None = None
    dropped: tuple[str, ...] = ()  # a reason per value withheld as physically impossible
    # Requests that got their first token per second: the TTFT histogram's observations (one per request).
    requests_per_second: float | None = None
    slo_tail: Mapping[str, float] = field(default_factory=dict)  # SLO_QUANTILE of "ttft" and "itl"
    energy_watts: float | None = None  # mean power of the target's GPUs from NVML's energy counter, same window
    kv_transfer_tokens_per_second: float | None = None  # prompt tokens whose KV came over a KV connector
    kv_transfer_bytes_per_second: float | None = None  # those tokens x K+V bytes per token (all TP ranks)
    kv_transfer_latency_seconds: float | None = None  # mean KV transfer time (SGLang disaggregated)
    kv_transfer_speed_bytes_per_second: float | None = None  # mean KV transfer speed (SGLang disaggregated)
    prefix_cache_hit_ratio: float | None = None  # prompt tokens found in the prefix cache / looked up
    # What prefill MFU counts as prefill work: "computed" (the engine counts computed prompt tokens),
    # "hits_subtracted" (all prompt tokens x (1 - the window's hit ratio)), "includes_cache_hits" (all
    # prompt tokens, the engine telling nothing of its cache: MFU may overstate). None without prefill.
    prefill_tokens_basis: str | None = None
    tokens_per_step: float | None = None  # tokens one step ran (MoE expert coverage), over the window
    step_token_mix: Lengths | None = None  # their distribution over the window's steps (vLLM's iteration_tokens)
    mean_prompt_tokens: float | None = None  # of the requests that finished in the window (prefill attention)
    prompt_length_mix: Lengths | None = None  # their prompt lengths' distribution (the prompt-length histogram)
    computed_prefill_tokens_per_second: float | None = None  # prompt tokens/s computed: prefix-cache hits out
    draft_passes_per_step: float | None = None  # draft-model passes a step (draft tokens / proposals), k
    # Per-request distributions by percentile, over the requests that finished in the window.
    prompt_length: Mapping[str, float] = field(default_factory=dict)  # prompt tokens per request
    output_length: Mapping[str, float] = field(default_factory=dict)  # output tokens per request
    queue_time: Mapping[str, float] = field(default_factory=dict)  # seconds from arrival to first scheduling

    @property
    def mbu_to_dram(self) -> float | None:
        """Derived MBU over measured DRAM bandwidth utilization: 1 = the model accounts for the traffic.

        A ratio, not a difference, so it reads the same at 20% and at 80% utilization. Below 1: bytes the
        model does not explain (another tenant, activations, a KV term the constants miss). Above 1: the
        constants claim bytes the GPU did not move (wrong dtype, a sliding window, cache hits). Not given
        under 1% measured utilization, where the ratio is noise.
        """
        if self.mbu is None or self.dram_utilization is None or self.dram_utilization < 0.01:
            return None
        return self.mbu / self.dram_utilization


def derive_window(
    history: SeriesHistory,
    window: str,
    seconds: float,
    constants: TargetConstants | None,
    kv_capacity_tokens: float | None,
    percentiles: tuple[str, ...],
) -> WindowValues | None:
    span = history.window(seconds)
    if span is None:
        return None
    first, last = span
    tokens = _phase_rates(first, last)
    steps = rate(first, last, STEPS)
    kv_usage = mean(first, last, KV_USAGE)
    running = mean(first, last, RUNNING)
    live_kv = live_kv_bytes(kv_usage, kv_capacity_tokens, constants)
    prompt_increase, step_increase = increase(first, last, PROMPT), increase(first, last, STEPS)
    ttft, itl = histogram_delta(first, last, TTFT), histogram_delta(first, last, ITL)
    hit_ratio = prefix_cache_hit_ratio(first, last)
    computed, basis = computed_prefill(tokens.get("prefill"), hit_ratio, PROMPT_INCLUDES_HITS in last.gauges)
    per_step = _tokens_per_step(first, last, computed / tokens["prefill"] if computed and tokens.get("prefill") else 1.0)
    step_mix = _step_token_mix(first, last, per_step)
    prompts = prompt_length_mix(first, last)
    draft_passes = _draft_passes_per_step(first, last)
    streamed = _streamed_bytes_per_second(
        constants, live_kv_layer_tokens(kv_usage, kv_capacity_tokens, constants), steps,
        step_mix or Lengths.one(max(running or 0.0, 1.0)), draft_passes)
    flops = _flops_per_second(constants, tokens, computed, prompts, hit_ratio,
                              _decode_context_layer_tokens(kv_usage, kv_capacity_tokens, running, constants),
                              _prefills_per_second(first, last, ttft))
    mbu, mfu, dropped = _in_range(_per_peak(streamed, constants.peak_bandwidth if constants else None),
                                  _per_peak_by_phase(flops, constants.peak_flops if constants else None))
    # The work counted for the counters is what the ratios count, without the ratios withheld.
    streamed = None if MBU_OUT_OF_RANGE in dropped else streamed
    flops = {phase: v for phase, v in flops.items() if phase in mfu or MFU_OUT_OF_RANGE not in dropped}
    (ttft_percentiles, ttft_tail), (itl_percentiles, itl_tail) = (
        _percentiles_and_tail(ttft, percentiles), _percentiles_and_tail(itl, percentiles))
    transferred = rate(first, last, KV_TRANSFER)
    return WindowValues(
        window=window,
        seconds=last.t - first.t,
        tokens_per_second=tokens,
        steps_per_second=steps,
        preemptions_per_second=rate(first, last, PREEMPTIONS),
        mbu=mbu,
        mfu=mfu,
        streamed_bytes_per_second=streamed,
        flops_per_second=flops,
        decode_intensity=_decode_intensity(constants, running,
                                           live_kv_layer_tokens(kv_usage, kv_capacity_tokens, constants)),
        ttft=ttft_percentiles,
        itl=itl_percentiles,
        mean_running=running,
        mean_waiting=mean(first, last, WAITING),
        mean_kv_usage=kv_usage,
        mean_live_kv_bytes=live_kv,
        prefill_tokens_per_step=(
            prompt_increase / step_increase if prompt_increase is not None and step_increase else None
        ),
        spec_decode_acceptance=_ratio(increase(first, last, ACCEPTED), increase(first, last, DRAFT)),
        spec_decode_tokens_per_step=_plus_one(_ratio(increase(first, last, ACCEPTED), increase(first, last, DRAFTS))),
        spec_decode_draft_length=_ratio(increase(first, last, DRAFT), increase(first, last, DRAFTS)),
        **_finished(first, last),
        dropped=dropped,
        requests_per_second=_observation_rate(ttft, last.t - first.t),
        slo_tail={name: v for name, v in (("ttft", ttft_tail), ("itl", itl_tail)) if v is not None},
        kv_transfer_tokens_per_second=transferred,
        kv_transfer_bytes_per_second=kv_bytes(transferred, constants),
        kv_transfer_latency_seconds=_scaled(transfer_mean(first, last, KV_TRANSFER_MS_SUM, KV_TRANSFER_MS_COUNT,
                                                          KV_TRANSFER_MS), 1e-3),
        kv_transfer_speed_bytes_per_second=_scaled(
            transfer_mean(first, last, KV_TRANSFER_GBPS_SUM, KV_TRANSFER_GBPS_COUNT, KV_TRANSFER_GBPS), 1e9),
        prefix_cache_hit_ratio=hit_ratio,
        prefill_tokens_basis=basis,
        tokens_per_step=per_step,
        step_token_mix=step_mix,
        mean_prompt_tokens=prompts.mean() if prompts is not None else None,
        prompt_length_mix=prompts,
        computed_prefill_tokens_per_second=computed,
        draft_passes_per_step=draft_passes,
        prompt_length=_percentiles(histogram_delta(first, last, PROMPT_LENGTH), percentiles),
        output_length=_percentiles(histogram_delta(first, last, OUTPUT_LENGTH), percentiles),
        queue_time=_percentiles(histogram_delta(first, last, QUEUE_TIME), percentiles),
    )


@dataclass(frozen=True, slots=True)
class WorkTotals:
    """The engine's work as MBU and MFU count it, summed over every sample since the agent began counting.

    Counters, so Prometheus can rate them and sum them across replicas: the recording rules' MBU is
    rate(streamed_bytes) / the copy's peak bandwidth, one definition with the agent's own (docs/physics.md,
    section Live ratios, The recording rules). None / absent until the model is known; then kept, and only
    ever added to.
    """

    at: float  # time of the last point counted
    streamed_bytes: float | None = None
    flops: Mapping[str, float] = field(default_factory=dict)  # by phase


def accumulate_work(totals: WorkTotals | None, previous: Point, latest: Point,
                    shortest: WindowValues | None) -> WorkTotals:
    """`totals` plus the work between the last two points: each counter's increase over them (steps,
    prompt tokens, generated tokens) x the work one of them did over the shortest window (its bytes per
    step, FLOPs per token), so the counters follow the engine's steps as they happen while a unit's work
    is the one the exported ratios used. Points already counted add nothing."""
    if totals is not None and latest.t <= totals.at:
        return totals
    if totals is None:
        totals = WorkTotals(at=previous.t)
    streamed, flops = totals.streamed_bytes, dict(totals.flops)
    if shortest is not None:
        if shortest.streamed_bytes_per_second is not None:
            streamed = (streamed or 0.0) + _work(shortest.streamed_bytes_per_second, shortest.steps_per_second,
                                                 increase(previous, latest, STEPS))
        for phase, counter in (("prefill", PROMPT), ("decode", GENERATION)):
            if phase in shortest.flops_per_second:
                flops[phase] = flops.get(phase, 0.0) + _work(
                    shortest.flops_per_second[phase], shortest.tokens_per_second.get(phase),
                    increase(previous, latest, counter))
    return WorkTotals(at=latest.t, streamed_bytes=streamed, flops=flops)


def _work(work_per_second: float, units_per_second: float | None, units: float | None) -> float:
    """The work of `units` steps or tokens at the window's work per unit; 0 without any."""
    per_unit = _ratio(work_per_second, units_per_second)
    return per_unit * units if per_unit is not None and units is not None and units > 0 else 0.0


def prefix_cache_hit_ratio(first: Point, last: Point) -> float | None:
    """Prompt tokens found in the prefix cache / prompt tokens looked up over the window, from the
    counters where the engine keeps them (None for a window without lookups: no traffic is not a 0% hit
    rate); else the time-weighted mean of the engine's own ratio gauge. Never above 1."""
    queries = increase(first, last, PREFIX_QUERIES)
    if queries is not None:
        ratio = _ratio(increase(first, last, PREFIX_HITS), queries)
    else:
        ratio = mean(first, last, PREFIX_HIT_RATIO)
    return ratio if ratio is not None and 0.0 <= ratio <= 1.0 else None


def transfer_mean(first: Point, last: Point, total: str, count: str, gauge: str) -> float | None:
    """The mean of a per-transfer quantity over the window: the histogram's sum / count increase where
    the engine keeps one (None for a window without transfers), else the time-weighted mean of its
    last-transfer gauge, only when the gauge was there from the window's start (a gauge that appeared
    mid-window would be averaged with the time before it as zero)."""
    transfers = increase(first, last, count)
    if transfers is not None:
        return _ratio(increase(first, last, total), transfers)
    return mean(first, last, gauge) if gauge in first.gauges else None


def _scaled(value: float | None, factor: float) -> float | None:
    return value * factor if value is not None else None


def kv_bytes(tokens: float | None, constants: TargetConstants | None) -> float | None:
    """K+V bytes of `tokens` tokens as the TP ranks hold them (each rank its shard, or its copy), all layers."""
    if tokens is None or constants is None or constants.layout is None:
        return None
    return constants.layout.token_kv_bytes(tokens)


def _observation_rate(hist: CorrectedHistogram | None, seconds: float) -> float | None:
    """Observations per second over the window: the +Inf bucket's increase over its length."""
    if hist is None or not hist.counts or seconds <= 0 or not math.isinf(hist.bounds[-1]):
        return None
    return max(0.0, hist.counts[-1]) / seconds


def _in_range(
    mbu: float | None, mfu: Mapping[str, float]
) -> tuple[float | None, dict[str, float], tuple[str, ...]]:
    """MBU and MFU without the values above MAX_UTILIZATION, and a reason per value withheld."""
    dropped = []
    if mbu is not None and not mbu <= MAX_UTILIZATION:
        dropped.append(MBU_OUT_OF_RANGE)
        mbu = None
    kept = {}
    for phase, value in mfu.items():
        if value <= MAX_UTILIZATION:
            kept[phase] = value
        else:
            dropped.append(MFU_OUT_OF_RANGE)
    return mbu, kept, tuple(dropped)


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _count(h: Histogram | None) -> float | None:
    return h.count if h is not None else None


def _sum(h: Histogram | None) -> float | None:
    return h.sum if h is not None else None


def _finished(first: Point, last: Point) -> dict[str, float | None]:
    """The finished requests' rate and mean prompt and output tokens over the window (absent without both
    per-request histograms, or with no request finished)."""
    done = increase(first, last, FINISHED)
    prompt, output = increase(first, last, FINISHED_PROMPT), increase(first, last, FINISHED_OUTPUT)
    if not done or prompt is None or output is None or last.t <= first.t:
        return {}
    return {"finished_requests_per_second": done / (last.t - first.t),
            "finished_mean_prompt_tokens": prompt / done, "finished_mean_output_tokens": output / done}


def _plus_one(x: float | None) -> float | None:
    return None if x is None else 1.0 + x


def stall_inputs(history: SeriesHistory, seconds: float) -> dict[str, float | None]:
    """The stall detector's inputs over the last `seconds`: the least requests held (running + waiting) and
    the progress made (engine steps + prompt + generated tokens, reset-corrected). Both None until the
    history covers nearly the whole span. Progress is None where the engine counts no steps: one that counts
    tokens only when a request ends (TensorRT-LLM) would read as stalled for as long as its longest request.
    Where progress was made, the held requests are not looked at (None): progress alone rules a stall out,
    and reading every point of the span on every sample is most of what the detector costs at 10 Hz."""
    span = history.window(seconds)
    if span is None or span[1].t - span[0].t < seconds * 0.9:
        return {"held_min_stall": None, "progress_stall": None}
    first, last = span
    progress = None
    if STEPS in last.counters and STEPS in first.counters:
        progress = sum(last.counters[c] - first.counters[c] for c in (STEPS, PROMPT, GENERATION)
                       if c in last.counters and c in first.counters)
        if progress > 0:
            return {"held_min_stall": None, "progress_stall": progress}
    held = [p.gauges[RUNNING] + p.gauges.get(WAITING, 0.0) for p in history.points_since(first) if RUNNING in p.gauges]
    return {"held_min_stall": min(held) if held else None, "progress_stall": progress}


def live_kv_bytes(
    kv_usage: float | None, capacity: float | None, constants: TargetConstants | None
) -> float | None:
    """Live KV bytes = occupancy x capacity in tokens x K+V bytes per pool token, summed over the TP GPUs.

    Heads shard across GPUs, so the sum is the model's per-token bytes; where every GPU holds all of it
    (an MLA latent, or fewer KV heads than GPUs) each GPU streams its own copy. A pool token holds the
    layers the engine pages together: every layer, or one attention-type group of a hybrid model under
    vLLM's hybrid KV-cache manager (step.Layout.pool_layers).
    """
    layer_tokens = live_kv_layer_tokens(kv_usage, capacity, constants)
    return None if layer_tokens is None else constants.layout.kv_bytes(layer_tokens)  # type: ignore[union-attr]


def live_kv_layer_tokens(kv_usage: float | None, capacity: float | None,
                         constants: TargetConstants | None) -> float | None:
    """KV layer-tokens the pool holds: occupancy x capacity in pool tokens x layers a pool token holds."""
    if kv_usage is None or capacity is None or constants is None or constants.layout is None:
        return None
    return constants.layout.pool_layer_tokens(kv_usage, capacity)


def _phase_rates(first: Point, last: Point) -> dict[str, float]:
    out = {}
    for phase, name in (("prefill", PROMPT), ("decode", GENERATION)):
        value = rate(first, last, name)
        if value is not None:
            out[phase] = value
    return out


def computed_prefill(prompt_rate: float | None, hit_ratio: float | None,
                     includes_hits: bool) -> tuple[float | None, str | None]:
    """(prompt tokens/s the engine computed, how that was known) from its prompt-token rate. Where the
    counter counts prefix-cache hits too, the window's hit ratio takes them out; where nothing tells
    the hit ratio, the rate stays as counted and says so ("includes_cache_hits")."""
    if prompt_rate is None:
        return None, None
    if not includes_hits:
        return prompt_rate, "computed"
    if hit_ratio is not None:
        return prompt_rate * (1.0 - hit_ratio), "hits_subtracted"
    return prompt_rate, "includes_cache_hits"


def _tokens_per_step(first: Point, last: Point, computed_share: float) -> float | None:
    """Tokens one engine step ran over the window (physics.moe_tokens_per_step); `computed_share` of the
    prompt counter's tokens were computed (the rest prefix-cache hits, which run through no expert)."""
    return physics.moe_tokens_per_step(
        _scaled(increase(first, last, PROMPT), computed_share), increase(first, last, GENERATION),
        increase(first, last, STEPS), increase(first, last, ITERATION_TOKENS))


def prompt_length_mix(first: Point, last: Point) -> Lengths | None:
    """The prompt lengths of the requests that finished in the window, from their histogram's buckets and sum
    (step.Lengths.from_histogram): their attention grows with E[L^2], which the mean's square understates."""
    hist = histogram_delta(first, last, PROMPT_LENGTH)
    total = increase(first, last, PROMPT_LENGTH_SUM)
    if hist is not None:
        mix = Lengths.from_histogram(hist.bounds, hist.counts, total)
        if mix is not None and mix.mean() > 0:
            return mix
    mean_length = _ratio(total, increase(first, last, PROMPT_LENGTH_COUNT))
    return Lengths.one(mean_length) if mean_length is not None and mean_length > 0 else None


def _step_token_mix(first: Point, last: Point, per_step: float | None) -> Lengths | None:
    """Tokens per step over the window's steps: vLLM's iteration_tokens buckets (each step's own count, where
    MoE coverage, concave in the tokens, is read step by step), else every step at the mean."""
    hist = histogram_delta(first, last, STEP_TOKENS)
    if hist is not None:
        mix = Lengths.from_histogram(hist.bounds, hist.counts, increase(first, last, ITERATION_TOKENS))
        if mix is not None:
            return mix
    return Lengths.one(per_step) if per_step is not None else None


def _prefills_per_second(first: Point, last: Point, ttft: CorrectedHistogram | None) -> float:
    """Prefills that produced logits per second: requests that got their first token (TTFT observations),
    else requests that finished (the prompt-length histogram's count); 0 where neither is on the page."""
    seconds = last.t - first.t
    first_tokens = _observation_rate(ttft, seconds)
    if first_tokens is not None:
        return first_tokens
    finished = increase(first, last, PROMPT_LENGTH_COUNT)
    return max(0.0, finished) / seconds if finished is not None and seconds > 0 else 0.0


def _decode_context_layer_tokens(kv_usage: float | None, capacity: float | None, running: float | None,
                                 constants: TargetConstants | None) -> float | None:
    """Layer-tokens one running sequence's cache holds (what each of its decode tokens attends to, summed
    over layers): occupancy x pool tokens x layers a pool token holds / mean running sequences."""
    layer_tokens = live_kv_layer_tokens(kv_usage, capacity, constants)
    if layer_tokens is None or not running or running <= 0:
        return None
    return layer_tokens / running


def _draft_passes_per_step(first: Point, last: Point) -> float | None:
    """Draft-model forward passes per engine step: draft tokens per proposal (k) over the window; every
    step is taken to draft while any did. None without speculative decoding."""
    drafts = increase(first, last, DRAFTS)
    return _ratio(increase(first, last, DRAFT), drafts)


def _streamed_bytes_per_second(
    constants: TargetConstants | None, kv_layer_tokens: float | None, steps: float | None, step_tokens: Lengths,
    draft_passes: float | None = None,
) -> float | None:
    """Bytes the engine's steps read per second, as MBU counts them (MBU = this / the copy's peak
    bandwidth): the step model's bytes of a step of these tokens (step.Layout.cost: the weights its tokens
    touch, a draft model's per draft pass, every live KV byte) x steps/s. None where an input is unknown."""
    if constants is None or constants.layout is None or kv_layer_tokens is None or steps is None:
        return None
    step = Step(step_tokens=step_tokens, kv_layer_tokens=kv_layer_tokens, draft_passes=draft_passes or 0.0)
    return constants.layout.cost(step).bytes * steps


def _flops_per_second(constants: TargetConstants | None, tokens: Mapping[str, float],
                      computed_prefill: float | None, prompts: Lengths | None, hit_ratio: float | None,
                      decode_context: float | None, prefills_per_second: float = 0.0) -> dict[str, float]:
    """FLOP/s by phase, as MFU counts them (MFU = this / the copy's peak FLOP/s): the step model's FLOPs of a
    second of the window's work (step.Layout.prefill_flops, decode_flops: the prompts' attention from their
    length distribution, the cached prefix attended to and not recomputed, the LM head once per prefill; a
    decode token's attention over its sequence's cache). Empty without a model."""
    if constants is None or constants.layout is None:
        return {}
    layout, out = constants.layout, {}
    if "prefill" in tokens and computed_prefill is not None:
        out["prefill"] = layout.prefill_flops(
            Prefill(computed_prefill, prompt_spans(prompts, hit_ratio), prefills_per_second))
    if "decode" in tokens:
        out["decode"] = layout.decode_flops(Decode(tokens["decode"], decode_context or 0.0))
    return out


def _per_peak(work: float | None, peak: float | None) -> float | None:
    """A utilization: work per second over the peak of the GPUs one model copy spans. None where either is
    unknown, the GPU's peak included: another GPU's would be a wrong denominator (docs/physics.md, section
    GPU constants)."""
    return work / peak if work is not None and peak else None


def _per_peak_by_phase(work: Mapping[str, float], peak: float | None) -> dict[str, float]:
    return {phase: v / peak for phase, v in work.items()} if peak else {}


def _decode_intensity(
    constants: TargetConstants | None, running: float | None, kv_layer_tokens: float | None
) -> float | None:
    """FLOPs per byte of a decode step of the window's mean running batch over its live KV (step model)."""
    if constants is None or constants.layout is None or running is None or kv_layer_tokens is None or running <= 0:
        return None
    step = Step(decode=Decode(running, kv_layer_tokens / running), kv_layer_tokens=kv_layer_tokens)
    return constants.layout.cost(step).intensity


def _percentiles(delta: CorrectedHistogram | None, percentiles: tuple[str, ...]) -> dict[str, float]:
    if delta is None:
        return {}
    values = histogram_quantiles(_quantiles_of(percentiles), delta)
    return {p: v for p, v in zip(percentiles, values) if v is not None}


def _percentiles_and_tail(
    delta: CorrectedHistogram | None, percentiles: tuple[str, ...]
) -> tuple[dict[str, float], float | None]:
    """The exported percentiles of a histogram and its SLO_QUANTILE, from one pass over its counts."""
    if delta is None:
        return {}, None
    *values, tail = histogram_quantiles(_quantiles_of(percentiles) + (SLO_QUANTILE,), delta)
    return {p: v for p, v in zip(percentiles, values) if v is not None}, tail


@functools.lru_cache(maxsize=32)
def _quantiles_of(percentiles: tuple[str, ...]) -> tuple[float, ...]:
    """The percentiles' names as quantiles (parsed once per configuration, not per window and sample)."""
    return tuple(float(p) / 100.0 for p in percentiles)
