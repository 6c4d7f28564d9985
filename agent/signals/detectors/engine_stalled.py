"""Engine stalled: requests held and no progress, from an engine whose /metrics still answers.

Requests held (running or waiting, never 0) through the last `stall_seconds` and not one engine step nor
one prompt or generated token in them, from an engine whose /metrics answered every sample. Hung, not
slow: a slow engine still moves its counters. The Prometheus alert RooflightEngineStalled
(rules/health.py) pages on the same condition over minutes.
"""

from __future__ import annotations

from typing import Any

from rooflight.agent.signals.detectors.base import NONNEG, Detector, DetectorInputs, Knob, Series, Verdict, above, \
    all_of


def engine_stalled(inputs: DetectorInputs, t: Any) -> Verdict:
    """Requests held through the stall window and no step or token in it: hung, not slow."""
    return all_of(
        above(inputs.held_min_stall, 0.0),
        None if inputs.progress_stall is None else inputs.progress_stall <= 0.0,
    )


DETECTOR = Detector(
    key="engine_stalled",
    judge=engine_stalled,
    order=50,
    title="Engine stalled",
    sentence="Requests are held and the engine has run no step and produced no token for half a minute while its "
             "metrics still answer: hung, not slow.",
    flag=Series("rooflight_engine_stalled", "1 while requests were held (running or waiting) through the last "
                                            "stall_seconds (30 s) and the engine ran no step and produced no token "
                                            "in them, its /metrics answering: hung, not slow."),
    alert="RooflightEngineStalled",
    alert_note="`rules/health.py`: the same condition over the counters, over minutes",
    knobs=(Knob("stall_seconds", 30.0, NONNEG, "how long requests must be held with no step and no token for the "
                "engine to be stalled. Longer than any one engine step: chunked prefill keeps steps well under a "
                "second; a whole 100k-token prompt on a slow GPU takes seconds, not half a minute."),),
)
