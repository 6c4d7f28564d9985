"""The simulated engine's own counters and histograms, with vLLM's exact bucket edges.

The simulator observes tens of thousands of tokens per simulated second, so it keeps plain
per-bucket counts (one bisect per distinct value, `n` observations at once) instead of calling
prometheus_client's observe() per token. The exposition renders these as vLLM would.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

# vLLM's defaults (vllm/v1/metrics/buckets.py upstream), the edges the recorded pages in
# tests/fixtures/engine-samples/vllm-cpu-*.prom carry.
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                   120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                       7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
                    16384.0)
REQUEST_PARAMS_N = (1.0, 2.0, 5.0, 10.0, 20.0)
REQUEST_NUM_PREEMPTIONS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to max_model_len (1, 2, 5, 10, ..., 5000 for 8192)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


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

# Histogram family name (without `vllm:`) -> bucket set name; request_tokens edges depend on max_model_len.
HISTOGRAMS = {
    "request_prompt_tokens": "request_tokens",
    "request_generation_tokens": "request_tokens",
    "iteration_tokens_total": "iteration_tokens",
    "request_max_num_generation_tokens": "request_tokens",
    "request_params_n": "request_params_n",
    "request_params_max_tokens": "request_tokens",
    "time_to_first_token_seconds": "time_to_first_token",
    "inter_token_latency_seconds": "inter_token_latency",
    "request_time_per_output_token_seconds": "inter_token_latency",
    "e2e_request_latency_seconds": "request_latency",
    "request_queue_time_seconds": "request_latency",
    "request_inference_time_seconds": "request_latency",
    "request_prefill_time_seconds": "request_latency",
    "request_decode_time_seconds": "request_latency",
    "request_num_preemptions": "request_num_preemptions",
    "request_prefill_kv_computed_tokens": "request_tokens",
}


def _edges(family: str, max_model_len: int) -> tuple[float, ...]:
    return {
        "request_tokens": request_token_buckets(max_model_len),
        "iteration_tokens": ITERATION_TOKENS,
        "request_params_n": REQUEST_PARAMS_N,
        "time_to_first_token": TIME_TO_FIRST_TOKEN,
        "inter_token_latency": INTER_TOKEN_LATENCY,
        "request_latency": REQUEST_LATENCY,
        "request_num_preemptions": REQUEST_NUM_PREEMPTIONS,
    }[family]


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
                name: Buckets(_edges(family, self.max_model_len)) for name, family in HISTOGRAMS.items()
            }

    def observe(self, family: str, value: float, n: float = 1.0) -> None:
        self.histograms[family].observe(value, n)
