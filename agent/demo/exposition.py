"""Render the simulated engine as vLLM's /metrics text (V1 engine, single API-server process).

Names, HELP/TYPE lines, label sets (`engine`, `model_name`; `cache_config_info` without
`model_name`; `admission_rejections` without `engine`), histogram bucket edges and `_created`
samples follow the recorded vLLM pages in tests/fixtures/engine-samples/. The estimated FLOP/byte
counters count as vLLM's --enable-mfu-metrics would. Labels are sorted, as prometheus_client writes
them. Pure: state in, text out.
"""

from __future__ import annotations

from typing import Iterable

from rooflight.agent.demo.config import DemoConfig
from rooflight.agent.demo.engine import Simulator
from rooflight.agent.demo.tally import FINISH_REASONS

_HELP = {
    "estimated_flops_per_gpu": "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
    "estimated_read_bytes_per_gpu": "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
    "estimated_write_bytes_per_gpu": "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    "engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_tokens_by_source": "Number of prompt tokens by source.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "generation_tokens": "Number of generation tokens processed.",
    "request_success": "Count of successfully processed requests.",
    "admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
}

Labels = dict[str, str]


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v))


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self, created: float) -> None:
        self.lines: list[str] = []
        self.created = created

    def family(self, name: str, kind: str, series: Iterable[tuple[Labels, float]]) -> None:
        """A gauge, or a counter (`name` without _total: written as name_total plus name_created)."""
        full = f"vllm:{name}_total" if kind == "counter" else f"vllm:{name}"
        rows = list(series)
        self.lines += [f"# HELP {full} {_HELP[name]}", f"# TYPE {full} {kind}"]
        self.lines += [f"{full}{_labels(lb)} {_num(v)}" for lb, v in rows]
        if kind == "counter":
            self._created(name, [lb for lb, _ in rows])

    def _created(self, name: str, label_sets: list[Labels]) -> None:
        full = f"vllm:{name}_created"
        self.lines += [f"# HELP {full} {_HELP[name]}", f"# TYPE {full} gauge"]
        self.lines += [f"{full}{_labels(lb)} {_num(self.created)}" for lb in label_sets]

    def histogram(self, name: str, labels: Labels, cumulative: list[tuple[float, float]], count: float, total: float) -> None:
        full = f"vllm:{name}"
        self.lines += [f"# HELP {full} {_HELP[name]}", f"# TYPE {full} histogram"]
        for edge, c in cumulative:
            self.lines.append(f"{full}_bucket{_labels({**labels, 'le': _num(edge)})} {_num(c)}")
        self.lines.append(f"{full}_count{_labels(labels)} {_num(count)}")
        self.lines.append(f"{full}_sum{_labels(labels)} {_num(total)}")
        self._created(name, [labels])


def http_responses(finished: float, server_errors: int) -> list[str]:
    """vLLM's API server's HTTP counter (prometheus-fastapi-instrumentator): one response a finished request,
    by status class; the 5xx series exists once one was answered, as the instrumentator creates it."""
    name, labels = "http_requests_total", {"handler": "/v1/chat/completions", "method": "POST"}
    lines = ["# HELP http_requests_total Total number of requests by method, status and handler.",
             "# TYPE http_requests_total counter",
             f"{name}{_labels({**labels, 'status': '2xx'})} {_num(finished - server_errors)}"]
    if server_errors:
        lines.append(f"{name}{_labels({**labels, 'status': '5xx'})} {_num(server_errors)}")
    return lines


def render(sim: Simulator, config: DemoConfig, created: float, running: int | None = None,
           server_errors: int = 0) -> str:
    """The full vLLM-format exposition for the simulator's current state (`running`: the count its gauges
    stuck at, where they are stuck; `server_errors`: its finished requests answered 5xx)."""
    L: Labels = {"engine": "0", "model_name": config.served_model_name}
    tl = sim.tally
    w = _Writer(created)
    w.family("estimated_flops_per_gpu", "counter", [(L, tl.estimated_flops)])
    w.family("estimated_read_bytes_per_gpu", "counter", [(L, tl.estimated_read_bytes)])
    w.family("estimated_write_bytes_per_gpu", "counter", [(L, tl.estimated_write_bytes)])
    w.family("num_requests_running", "gauge", [(L, len(sim.running) if running is None else running)])
    w.family("num_requests_waiting", "gauge", [(L, len(sim.waiting))])
    w.family("num_requests_waiting_by_reason", "gauge",
             [({**L, "reason": "capacity"}, len(sim.waiting)), ({**L, "reason": "deferred"}, 0.0)])
    w.family("engine_sleep_state", "gauge", [({**L, "sleep_state": s}, 1.0 if s == "awake" else 0.0)
                                             for s in ("awake", "weights_offloaded", "discard_all")])
    w.family("kv_cache_usage_perc", "gauge", [(L, sim.kv_usage)])
    w.family("prefix_cache_queries", "counter", [(L, tl.prefix_cache_queries)])
    w.family("prefix_cache_hits", "counter", [(L, 0.0)])
    w.family("num_preemptions", "counter", [(L, tl.preemptions)])
    w.family("prompt_tokens", "counter", [(L, tl.prompt_tokens)])
    w.family("prompt_tokens_by_source", "counter",
             [({**L, "source": "local_compute"}, tl.prompt_tokens), ({**L, "source": "local_cache_hit"}, 0.0),
              ({**L, "source": "external_kv_transfer"}, 0.0)])
    w.family("prompt_tokens_cached", "counter", [(L, 0.0)])
    w.family("generation_tokens", "counter", [(L, tl.generation_tokens)])
    w.family("request_success", "counter", [({**L, "finished_reason": r}, tl.request_success[r]) for r in FINISH_REASONS])
    w.family("admission_rejections", "counter",
             [({"model_name": config.served_model_name, "reason": "max_num_queued_reqs"}, tl.admission_rejections),
              ({"model_name": config.served_model_name, "reason": "max_num_queued_tokens"}, 0.0)])
    for name, h in tl.histograms.items():
        w.histogram(name, L, h.cumulative(), h.count, h.sum)
    w.family("cache_config_info", "gauge", [(cache_config_labels(sim, config), 1.0)])
    w.lines += http_responses(sum(tl.request_success.values()), server_errors)
    return "\n".join(w.lines) + "\n"


def cache_config_labels(sim: Simulator, config: DemoConfig) -> Labels:
    """vLLM's CacheConfig as info labels (strings, "None" for unset), plus `engine`."""
    p = sim.plant
    return {
        "block_size": str(p.block_size),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": str(p.gpu_memory_utilization),
        "is_attention_free": "False",
        "kv_cache_max_concurrency": str(round(p.kv_capacity_tokens / config.max_model_len, 2)),
        "kv_cache_memory_bytes": str(int(p.num_gpu_blocks * p.block_size * p.kv_bytes_per_token)),
        "kv_cache_size_tokens": str(p.kv_capacity_tokens),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(p.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
        "user_specified_block_size": "False",
    }
