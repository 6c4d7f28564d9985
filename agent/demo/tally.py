"""The simulated engine's own counters and histograms, with vLLM's exact bucket edges (its adapter's).

The simulator observes tens of thousands of tokens per simulated second, so it keeps plain
per-bucket counts (one bisect per distinct value, `n` observations at once) instead of calling
prometheus_client's observe() per token. The exposition renders these as vLLM would.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from rooflight.collectors import vllm


@dataclass(slots=True)
class Buckets:
    """Non-cumulative bucket counts over fixed upper bounds; the last slot is +Inf."""

    edges: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    sum: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.edges) + 1)

    def observe(self, value: float, n: float = 1.0) -> None:
        # Prometheus buckets are `le`: a value equal to an edge belongs to that edge's bucket.
        self.counts[bisect_left(self.edges, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) pairs, the last bound being +Inf."""
        out: list[tuple[float, float]] = []
        running = 0.0
        for edge, c in zip(self.edges + (float("inf"),), self.counts):
            running += c
            out.append((edge, running))
        return out


FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass(slots=True)
class Tally:
    """Everything cumulative the engine exports (counters in tokens, requests, FLOPs, bytes)."""

    max_model_len: int
    prompt_tokens: float = 0.0  # computed prefill tokens, recompute after preemption included
    generation_tokens: float = 0.0
    steps: float = 0.0
    preemptions: float = 0.0
    prefix_cache_queries: float = 0.0
    estimated_flops: float = 0.0
    estimated_read_bytes: float = 0.0
    estimated_write_bytes: float = 0.0
    busy_seconds: float = 0.0  # simulated time with a step running (the NVML residency source)
    admission_rejections: float = 0.0
    request_success: dict[str, float] = field(default_factory=lambda: {r: 0.0 for r in FINISH_REASONS})
    histograms: dict[str, Buckets] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.histograms:
            self.histograms = {
                name: Buckets(edges) for name, edges in vllm.default_histogram_edges(self.max_model_len).items()
            }

    def observe(self, family: str, value: float, n: float = 1.0) -> None:
        self.histograms[family].observe(value, n)
