"""The demo's configuration: which scenario, which model on which GPU, how the engine is set up.

Kept apart from the package `__init__` so the pure simulator can import it without pulling in the
HTTP server.
"""

from __future__ import annotations

from dataclasses import dataclass

from rooflight.agent.config import settings
from rooflight.agent.errors import ConfigError

# `rooflight demo`'s flags are declared in settings.py; their defaults are the simulator's too
_FLAGS = {s.key: s.flag_default for s in settings.offered(settings.DEMO)}


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """How to run `rooflight demo`'s simulated vLLM engine.

    `max_num_seqs=None` means the scenario's own cap (256; 16 for "queue"). `time_scale` is simulated
    seconds per wall second (>1 for soak tests). `max_num_batched_tokens=None` means vLLM's default:
    max(max_model_len, 2048) without chunked prefill, 2048 with it.
    """

    scenario: str = _FLAGS["scenario"]
    model: str = "llama-3-8b"
    gpu: str = "h100-sxm"
    max_num_seqs: int | None = _FLAGS["max_num_seqs"]
    seed: int = _FLAGS["seed"]
    time_scale: float = _FLAGS["time_scale"]
    chunked_prefill: bool = _FLAGS["chunked_prefill"]
    max_num_batched_tokens: int | None = None
    max_model_len: int = 8192
    max_num_queued_reqs: int = 1024
    served_model_name: str = "llama-3-8b"
    model_root: str = "meta-llama/Meta-Llama-3-8B-Instruct"
    bandwidth_efficiency: float = 0.8
    prefill_mfu: float = 0.5
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    tick_seconds: float = 0.05

    def __post_init__(self) -> None:
        from rooflight.agent.demo.scenarios import SCENARIOS

        if self.scenario not in SCENARIOS:
            raise ConfigError(f"unknown demo scenario {self.scenario!r}; choose one of {', '.join(SCENARIOS)}")
        if self.time_scale <= 0:
            raise ConfigError("demo time_scale must be > 0")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ConfigError("demo max_num_seqs must be >= 1")
        if not 0 < self.bandwidth_efficiency <= 1 or not 0 < self.prefill_mfu <= 1:
            raise ConfigError("demo efficiencies must be in (0, 1]")

    def batched_tokens_budget(self) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.chunked_prefill else max(self.max_model_len, 2048)
