"""What docs/physics.md predicts for the simulated engine's current state, for tests to hold the agent to.

`History` keeps marks of the simulator's cumulative counters (one per tick), so rates over a window
are computed the way the agent computes them from scrapes. `predicted_state` adds the step model's numbers
(agent/roofline/step.py, as the demo's own GPU runs them) for the batch as it stands: decode step time,
decode tokens/s, MBU, decode intensity; and the MFU of the window's work as the simulated GPU counted it.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Any

from rooflight.agent.demo import plant as costs
from rooflight.agent.roofline.step import Prefill, Step
from rooflight.agent.demo.engine import Simulator


@dataclass(frozen=True, slots=True)
class Mark:
    t: float
    prompt_tokens: float
    generation_tokens: float
    steps: float
    preemptions: float
    read_bytes: float
    flops: float
    busy_seconds: float


def mark(sim: Simulator) -> Mark:
    tl = sim.tally
    return Mark(sim.now, tl.prompt_tokens, tl.generation_tokens, tl.steps, tl.preemptions,
                tl.estimated_read_bytes, tl.estimated_flops, tl.busy_seconds)


class History:
    """Marks over the last `keep` simulated seconds."""

    def __init__(self, keep: float = 600.0) -> None:
        self.keep = keep
        self.marks: deque[Mark] = deque()

    def add(self, m: Mark) -> None:
        if self.marks and m.t <= self.marks[-1].t:
            self.marks[-1] = m
        else:
            self.marks.append(m)
        while self.marks and self.marks[0].t < m.t - self.keep:
            self.marks.popleft()

    def span(self, window: float) -> tuple[Mark, Mark] | None:
        """The oldest mark within `window` of the newest, and the newest; None with fewer than two."""
        if len(self.marks) < 2:
            return None
        last = self.marks[-1]
        # bisect, not a scan: ten minutes of 50 ms ticks is 12,000 marks, asked for every tick
        i = bisect.bisect_left(self.marks, last.t - window, key=lambda m: m.t)
        first = self.marks[i] if i < len(self.marks) else last
        if first is last:
            first = self.marks[-2]
        return first, last


def rates(history: History, window: float) -> dict[str, float]:
    """Per-second rates over the window, and the ratios the agent derives from them."""
    span = history.span(window)
    if span is None:
        return {}
    a, b = span
    dt = b.t - a.t
    if dt <= 0:
        return {}
    return {
        "window_seconds": dt,
        "prefill_tokens_per_second": (b.prompt_tokens - a.prompt_tokens) / dt,
        "decode_tokens_per_second": (b.generation_tokens - a.generation_tokens) / dt,
        "steps_per_second": (b.steps - a.steps) / dt,
        "preemptions_per_second": (b.preemptions - a.preemptions) / dt,
        "read_bytes_per_second": (b.read_bytes - a.read_bytes) / dt,
        "flops_per_second": (b.flops - a.flops) / dt,
        "busy_ratio": min(1.0, (b.busy_seconds - a.busy_seconds) / dt),
    }


def predicted_state(sim: Simulator, history: History, window: float = 10.0) -> dict[str, Any]:
    p = sim.plant
    decoding = [r for r in sim.running if r.decoding]
    batch = len(decoding)
    decode = costs.step_of(p, [], [r.computed for r in decoding])
    cost = costs.step_cost(p, decode)
    decode_step = costs.step_seconds(p, decode) if batch else 0.0
    prompt = 1024.0  # a prompt token's cost at the demo's own efficiency, for a 1,024-token prompt
    prefill_seconds = costs.step_cost(p, Step(prefill=Prefill(prompt, ((1.0, 0.0, prompt),), 1.0))).flops / p.roofs.flops
    out: dict[str, Any] = {
        "sim_time": sim.now,
        "running": len(sim.running),
        "waiting": len(sim.waiting),
        "waiting_by_reason": {"capacity": float(len(sim.waiting)), "deferred": 0.0},
        "max_num_seqs": sim.max_num_seqs,
        "batch_occupancy_ratio": len(sim.running) / sim.max_num_seqs,
        "decode_batch": batch,
        "kv_usage_ratio": sim.kv_usage,
        "kv_capacity_tokens": p.kv_capacity_tokens,
        "num_gpu_blocks": p.num_gpu_blocks,
        "kv_live_tokens": sim.live_kv_tokens,
        "kv_live_bytes": sim.live_kv_tokens * p.kv_bytes_per_token,
        "weight_bytes": p.weight_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "params_active": p.layout.model.params_active,
        "peak_bandwidth": p.peak_bandwidth,
        "peak_flops": p.peak_flops,
        "bandwidth_efficiency": p.bandwidth_efficiency,
        "prefill_mfu": p.prefill_mfu,
        # The step model (docs/physics.md, sections The step model, Decode step time and MBU) for the batch as
        # it stands, at the simulated GPU's own efficiencies.
        "decode_step_seconds": decode_step,
        "expected_mbu": cost.bytes / decode_step / p.peak_bandwidth if batch else 0.0,
        "expected_decode_tokens_per_second": batch / decode_step if batch else 0.0,
        "decode_intensity": cost.intensity if batch else 0.0,
        "prefill_tokens_per_second_at_mfu": prompt / prefill_seconds,
        "preemptions_total": sim.tally.preemptions,
        "steps_total": sim.tally.steps,
        "last_step_seconds": (sim.last_step.end - sim.last_step.start) if sim.last_step else 0.0,
    }
    r = rates(history, window)
    out["window"] = r
    if r:
        out["mbu"] = r["read_bytes_per_second"] / p.peak_bandwidth
        out["mfu"] = r["flops_per_second"] / p.peak_flops  # both phases, as the simulated GPU counted them
    return out
