"""Admission-bound batch: requests wait while the batch and the KV cache have room.

Requests waited through the whole short window (minimum at least `admission_min_waiting`) while the batch
sat below `admission_max_batch_fraction` of its cap and KV had room (occupancy below `kv_room_usage`).
Something upstream of the batch is binding.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.signals.detectors.base import (
    NONNEG, UNIT, Detector, DetectorInputs, GaugeAlert, Knob, Panel, Series, Verdict, all_of, at_least,
    batch_fraction, below,
)
from rooflight.agent.signals.detectors.capacity_capped import KV_BATCH_PANEL

# KV has room below this occupancy (this detector's and at_configured_max's)
KV_ROOM = Knob("kv_room_usage", 0.8, UNIT, "KV occupancy below this means KV has room (admission-bound, "
               "at-configured-max).")


def admission_bound(inputs: DetectorInputs, t: Any) -> Verdict:
    """A queue persisted while the batch was well below its cap and KV had room."""
    return all_of(
        at_least(inputs.waiting_min_short, t.admission_min_waiting),
        below(batch_fraction(inputs.running, inputs.batch_max), t.admission_max_batch_fraction),
        below(inputs.kv_usage, t.kv_room_usage),
    )


DETECTOR = Detector(
    key="admission_bound",
    judge=admission_bound,
    order=30,
    title="Batch admission-bound",
    sentence="Requests wait while the batch sits well below its cap and KV has room: something upstream "
             "of the batch binds it.",
    flag=Series("rooflight_batch_admission_bound", "1 while requests wait although the batch is well below its cap "
                                                   "and KV has room."),
    alert="RooflightBatchAdmissionBound",
    rule=GaugeAlert("Requests are queueing while the batch and the KV cache have room (admission-bound).",
                    "avg_over_time", "rooflight_requests_waiting", "kv-batch"),
    knobs=(
        Knob("admission_min_waiting", 1.0, NONNEG, "minimum queue over the short window: the queue persisted, not a "
             "blip."),
        Knob("admission_max_batch_fraction", 0.5, UNIT, "running / cap below this is \"well below its cap\"."),
        KV_ROOM,
    ),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "admission-bound", "C"),
    nvtx="admission-bound batch",
)
