"""The demo's traffic: one workload per scenario, and a seeded arrival stream drawn from it.

- steady: Poisson chat traffic (prompts lognormal, mean ~600 tokens, at most 2,048;
  outputs mean ~250); the batch
  settles far below its cap and the KV pool far below full.
- head-of-line: steady plus one 8,000-token prompt every 20 s (first at 10 s), prefilled whole: a
  ~260 ms step that every in-flight decode waits on (p99 ITL ~40x the ~6-8 ms baseline).
- kv-wall: long generations at a high rate; the KV pool pins at 100%, preemptions climb, requests
  wait for capacity.
- queue: the batch is capped at 16 sequences; running == cap with KV to spare, requests wait.
- idle: no traffic at all.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

SCENARIOS: tuple[str, ...] = ("steady", "head-of-line", "kv-wall", "queue", "idle")

LONG_PROMPT_TOKENS = 8000


@dataclass(frozen=True, slots=True)
class Workload:
    """Arrival rate (requests/s, Poisson) and lognormal prompt/output lengths (means, sigmas)."""

    arrival_rate: float
    prompt_mean: float = 600.0
    prompt_sigma: float = 0.6
    prompt_max: int = 2048  # chat prompts; the long ones are the head-of-line events, not the tail
    output_mean: float = 250.0
    output_sigma: float = 0.7
    long_prompt_every: float | None = None
    long_prompt_first: float = 10.0
    long_prompt_output: int = 200
    max_num_seqs: int = 256


WORKLOADS: dict[str, Workload] = {
    "steady": Workload(arrival_rate=10.0),
    "head-of-line": Workload(arrival_rate=10.0, long_prompt_every=20.0),
    "kv-wall": Workload(arrival_rate=6.0, prompt_mean=1500.0, prompt_sigma=0.4, prompt_max=4096,
                        output_mean=3500.0, output_sigma=0.3),
    "queue": Workload(arrival_rate=14.0, max_num_seqs=16),
    "idle": Workload(arrival_rate=0.0),
}


def workload_for(scenario: str) -> Workload:
    return WORKLOADS[scenario]


@dataclass(frozen=True, slots=True)
class Arrival:
    time: float
    prompt_tokens: int
    output_tokens: int
    injected: bool = False


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    # lognormvariate takes mu of the underlying normal; mean = exp(mu + sigma^2 / 2).
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2.0, sigma)


class ArrivalStream:
    """Seeded, deterministic stream of requests for one workload (plus the scheduled long prompts)."""

    def __init__(self, workload: Workload, seed: int, max_model_len: int) -> None:
        self._w = workload
        self._rng = random.Random(seed)
        self._max_model_len = max_model_len
        self._next_poisson = self._draw_gap(0.0)
        self._next_long = workload.long_prompt_first if workload.long_prompt_every else math.inf

    def _draw_gap(self, after: float) -> float:
        if self._w.arrival_rate <= 0:
            return math.inf
        return after + self._rng.expovariate(self._w.arrival_rate)

    def peek(self) -> float:
        """Time of the next arrival (inf if none will come)."""
        return min(self._next_poisson, self._next_long)

    def pop(self) -> Arrival:
        if self._next_long <= self._next_poisson:
            t = self._next_long
            self._next_long = t + (self._w.long_prompt_every or math.inf)
            return long_prompt(t, self._w.long_prompt_output)
        t = self._next_poisson
        self._next_poisson = self._draw_gap(t)
        drawn = round(_lognormal(self._rng, self._w.prompt_mean, self._w.prompt_sigma))
        prompt = max(1, min(self._w.prompt_max, self._max_model_len - 1, drawn))
        output = max(1, round(_lognormal(self._rng, self._w.output_mean, self._w.output_sigma)))
        return Arrival(t, prompt, min(output, self._max_model_len - prompt))


def long_prompt(at: float, output_tokens: int = 200, injected: bool = False) -> Arrival:
    """One 8,000-token prompt, the head-of-line event."""
    return Arrival(at, LONG_PROMPT_TOKENS, output_tokens, injected)


def kv_wall_burst(at: float, count: int = 200, prompt_tokens: int = 1000, output_tokens: int = 4000) -> list[Arrival]:
    """A burst of long-output requests that drives the KV pool into its wall."""
    return [Arrival(at, prompt_tokens, output_tokens, True) for _ in range(count)]
