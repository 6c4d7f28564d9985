"""Derived rates checked against the physics of the target's GPUs, before anything is derived from them.

derive.py withholds an MBU or MFU above MAX_UTILIZATION; the rates they come from must go with them, or
an impossible throughput (a counter that jumped 5e8 tokens/s, under windows.MAX_PLAUSIBLE_RATE) is
still exported as tokens/s and carried into cost per million tokens, tokens per joule and capacity.
A phase's tokens/s is possible when those tokens' FLOPs (the step model's for a token without context:
2 x the parameters it multiplies, docs/physics.md) fit in MAX_UTILIZATION x the peak FLOP/s of the GPUs one
model copy spans; requests/s when each request has at least one such token; steps/s when each step reads the
weights a step of the mean running batch touches within MAX_UTILIZATION x the peak bandwidth. With no model or no GPU profile there is no peak to check against and the windows pass
unchanged. Pure: no I/O, the counting of what is withheld stays with derive.py's reasons.
"""

from __future__ import annotations

from dataclasses import replace

from rooflight.agent.roofline.constants import TargetConstants
from rooflight.agent.roofline.step import Decode, Step
from rooflight.agent.signals.derive import MAX_UTILIZATION, WindowValues


def tokens_per_second_bound(constants: TargetConstants | None) -> float | None:
    """The most tokens/s one model copy can compute: MAX_UTILIZATION x peak FLOP/s over FLOPs per token."""
    if constants is None or constants.layout is None or not constants.peak_flops:
        return None
    per_token = constants.layout.cost(Step(decode=Decode(1.0, 0.0))).flops
    return MAX_UTILIZATION * constants.peak_flops / per_token if per_token > 0 else None


def steps_per_second_bound(constants: TargetConstants | None, running: float | None) -> float | None:
    """The most engine steps/s the weights can be streamed at: MAX_UTILIZATION x peak bandwidth / weight bytes."""
    if constants is None or constants.layout is None or not constants.peak_bandwidth:
        return None
    weights = constants.layout.cost(Step(decode=Decode(max(running or 1.0, 1.0), 0.0))).weight_bytes
    return MAX_UTILIZATION * constants.peak_bandwidth / weights if weights > 0 else None


def within_physics(w: WindowValues, constants: TargetConstants | None) -> WindowValues:
    """`w` without the rates its GPUs could not have produced (see the module docstring)."""
    tokens_bound = tokens_per_second_bound(constants)
    steps_bound = steps_per_second_bound(constants, w.mean_running)
    tokens = {phase: v for phase, v in w.tokens_per_second.items() if tokens_bound is None or v <= tokens_bound}
    requests = w.requests_per_second
    if requests is not None and tokens_bound is not None and requests > tokens_bound:
        requests = None
    steps = w.steps_per_second
    if steps is not None and steps_bound is not None and steps > steps_bound:
        steps = None
    if len(tokens) == len(w.tokens_per_second) and requests == w.requests_per_second and steps == w.steps_per_second:
        return w
    return replace(w, tokens_per_second=tokens, requests_per_second=requests, steps_per_second=steps)
