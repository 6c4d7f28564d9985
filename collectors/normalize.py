"""What of a normalized engine sample the agent keeps: pure checks between the adapter and the history.

An adapter reads what the page says; these say whether it can be so, the same for every engine. A KV
occupancy outside 0..1 (1e308 is not a ratio) is withheld as KV_USAGE_OUT_OF_RANGE; requests running or
waiting below 0 or past MAX_REQUESTS, and a prefix-cache hit ratio outside 0..1, as GAUGE_OUT_OF_RANGE;
a KV pool, batch cap, block size or TP of zero or past its plausible bound (collectors/common.py) as
INFO_OUT_OF_RANGE; and
(model, rank) series past the per-target cap are dropped, those already tracked kept first. Each check
returns the sample (the very object when nothing was withheld, the common case on every sample) with
what it withheld, for the engine loop to count in the source's health (docs/reliability.md, section
Bounds on what an engine can cost). No I/O, no clock, no state.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Container

from rooflight.collectors import expfmt
from rooflight.collectors.common import MAX_BATCH, MAX_KV_BLOCK_TOKENS, MAX_KV_TOKENS, MAX_TENSOR_PARALLEL, within
from rooflight.collectors.samples import EngineSample, EngineSeries

KV_USAGE_OUT_OF_RANGE = "kv_usage_out_of_range"  # an engine's KV occupancy outside 0..1
# A request count (running, waiting, waiting by reason) below 0 or past MAX_REQUESTS, or the engine's own
# prefix-cache hit ratio outside 0..1: a Dynamo frontend's `inflight_requests 1e308` was exported as is.
GAUGE_OUT_OF_RANGE = "gauge_out_of_range"
MAX_REQUESTS = 10_000_000  # requests running or queued behind one endpoint: a whole fleet's behind a frontend


def plausible(sample: EngineSample) -> tuple[EngineSample, dict[str, int]]:
    """The sample without the values that cannot be so, and how many were withheld by reason."""
    with expfmt.bounded(expfmt.Bounds()) as refused:
        series = tuple(_plausible_series(s) for s in sample.series)
        info = sample.info
        tp, block = within(info.tensor_parallel_size, MAX_TENSOR_PARALLEL), \
            within(info.kv_block_size_tokens, MAX_KV_BLOCK_TOKENS)
    if (tp, block) != (info.tensor_parallel_size, info.kv_block_size_tokens):
        info = replace(info, tensor_parallel_size=None if tp is None else int(tp), kv_block_size_tokens=block)
    if info is not sample.info or not all(a is b for a, b in zip(series, sample.series)):
        sample = replace(sample, series=series, info=info)
    return sample, refused.values_dropped


def _plausible_series(series: EngineSeries) -> EngineSeries:
    usage = series.kv_usage_ratio
    if usage is not None and not 0.0 <= usage <= 1.0:
        expfmt.drop_value(KV_USAGE_OUT_OF_RANGE)
        series = replace(series, kv_usage_ratio=None)
    running, waiting = _gauge(series.running, MAX_REQUESTS), _gauge(series.waiting, MAX_REQUESTS)
    hits = _gauge(series.prefix_cache_hit_ratio, 1.0)
    by_reason = series.waiting_by_reason
    out = [reason for reason, v in by_reason.items() if _gauge(v, MAX_REQUESTS) is None]
    if out:
        by_reason = {reason: v for reason, v in by_reason.items() if reason not in out}
    if (running, waiting, hits) != (series.running, series.waiting, series.prefix_cache_hit_ratio) \
            or by_reason is not series.waiting_by_reason:
        series = replace(series, running=running, waiting=waiting, prefix_cache_hit_ratio=hits,
                         waiting_by_reason=by_reason)
    capacity, batch = within(series.kv_capacity_tokens, MAX_KV_TOKENS), within(series.batch_max_requests, MAX_BATCH)
    if (capacity, batch) != (series.kv_capacity_tokens, series.batch_max_requests):
        series = replace(series, kv_capacity_tokens=capacity, batch_max_requests=batch)
    return series


def _gauge(value: float | None, upper: float) -> float | None:
    """The value if it is from 0 to `upper`, else None and counted (GAUGE_OUT_OF_RANGE); None stays None."""
    if value is None or 0.0 <= value <= upper:
        return value
    expfmt.drop_value(GAUGE_OUT_OF_RANGE)
    return None


def capped(sample: EngineSample, cap: int, tracked: Container[tuple[str, str]]) -> tuple[EngineSample, int]:
    """At most `cap` (model, rank) series, those `tracked` already first, then in page order, and how many
    were dropped. Thousands of models or LoRA adapters on one page would otherwise mean thousands of
    histories and tens of thousands of exported series."""
    dropped = max(0, len(sample.series) - cap)
    if not dropped:
        return sample, 0
    known = [s for s in sample.series if (s.model, s.rank) in tracked]
    new = [s for s in sample.series if (s.model, s.rank) not in tracked]
    return replace(sample, series=tuple((known + new)[:cap])), dropped
