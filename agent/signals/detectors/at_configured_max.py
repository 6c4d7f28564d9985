"""Batch at its configured maximum: running reached the cap while KV had room.

A config lever (max_num_seqs and friends), not the wall. It has no alert of its own: the admission-bound
runbook covers it.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.signals.detectors import admission_bound
from rooflight.agent.signals.detectors.base import Detector, DetectorInputs, Panel, Series, Verdict, all_of, at_least, \
    batch_fraction, below
from rooflight.agent.signals.detectors.capacity_capped import KV_BATCH_PANEL


def at_configured_max(inputs: DetectorInputs, t: Any) -> Verdict:
    """The batch reached its configured cap while KV still had room: raise the cap, not the hardware."""
    return all_of(
        at_least(batch_fraction(inputs.running, inputs.batch_max), 1.0),
        below(inputs.kv_usage, t.kv_room_usage),
    )


DETECTOR = Detector(
    key="at_configured_max",
    judge=at_configured_max,
    order=40,
    title="Batch at its configured maximum",
    sentence="The batch reached its configured cap (max_num_seqs) while KV has room: a config lever, "
             "not the hardware.",
    flag=Series("rooflight_batch_at_configured_max", "1 while running = the configured batch cap with KV room: a "
                                                     "config lever, not the memory wall."),
    alert=admission_bound.DETECTOR.alert,  # no alert of its own: the runbook's admission-bound section covers it
    knobs=(admission_bound.KV_ROOM,),
    panel=Panel("kv-batch", KV_BATCH_PANEL, "at configured max", "B"),
)
