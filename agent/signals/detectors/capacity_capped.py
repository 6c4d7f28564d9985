"""Capacity-capped batch: the KV cache is at the wall.

KV occupancy at the wall (its peak over the short window at least `capacity_kv_usage`), preemptions
climbing (rate above `capacity_min_preemptions_per_second`) and requests waiting. The memory wall, not
the scheduler.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.signals.detectors.base import (
    NONNEG, UNIT, Detector, DetectorInputs, GaugeAlert, Knob, Panel, Series, Verdict, above, all_of, at_least,
)

KV_BATCH_PANEL = "What limits the batch (detectors)"  # the KV cache and batch board's detector panel


def capacity_capped(inputs: DetectorInputs, t: Any) -> Verdict:
    """KV pinned near full, preemptions climbing, requests waiting: the memory wall."""
    return all_of(
        at_least(inputs.kv_usage_peak_short, t.capacity_kv_usage),
        above(inputs.preemptions_per_second_short, t.capacity_min_preemptions_per_second),
        at_least(inputs.waiting, t.capacity_min_waiting),
    )


DETECTOR = Detector(
    key="capacity_capped",
    judge=capacity_capped,
    order=20,
    title="Batch capacity-capped (KV wall)",
    sentence="The KV cache is at the wall: occupancy near full, preemptions climbing, requests waiting; "
             "memory, not the scheduler, binds the batch.",
    flag=Series("rooflight_batch_capacity_capped", "1 while the batch is capped by KV capacity: occupancy pinned "
                                                   "near 1, preemptions climbing, requests waiting."),
    alert="RooflightBatchCapacityCapped",
    rule=GaugeAlert("The batch is capped by KV-cache capacity: occupancy pinned, preemptions climbing, requests "
                    "waiting.", "avg_over_time", "rooflight_kv_cache_usage_ratio", "kv-batch"),
    knobs=(
        Knob("capacity_kv_usage", 0.95, UNIT, "KV occupancy whose short-window peak counts as the wall. A peak, not a "
             "mean or a minimum: a small pool thrashes (a real vLLM with 10 blocks swings between 0 and 100% as "
             "whole batches are preempted and recomputed), and with preemptions climbing the wall was hit in any "
             "case."),
        Knob("capacity_min_preemptions_per_second", 0.0, NONNEG, "preemption rate that must be exceeded (strictly)."),
        Knob("capacity_min_waiting", 1.0, NONNEG, "queued requests needed for the batch to be capped rather than "
             "merely full."),
    ),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "capacity-capped", "A"),
    nvtx="capacity-capped batch",
)
