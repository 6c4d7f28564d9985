"""What engines keep out of /metrics, read from their JSON info endpoints: batch cap, model, context, TP.

No engine but TRT-LLM and Dynamo exports its batch cap or model on /metrics (shared/reference/
engines.md section 12). Each has a JSON route that does; `INFO_PATHS` names it and
`parse_info(engine, data)` turns its decoded JSON into an `EngineInfoHints`. Pure: the agent
fetches (once at start and every few minutes), this module only reads. Every field is None when the
document does not state it; nothing is guessed, and a value that is not a positive number is not
a value. The documents each parser expects are in docs/engines.md ("Info endpoints").

- vLLM `/v1/models`: `data[0].root` (the model path or HF id; `id`, the served name, when `root` is
  absent) and `data[0].max_model_len`. No batch cap or TP there.
- SGLang `/server_info` (older: `/get_server_info`): the server args flattened: `model_path`,
  `tp_size`, `context_length`, `max_running_requests`. The last two are null when left to SGLang
  to choose; the effective values are then read from `internal_states[0]`
  (`effective_max_running_requests_per_dp`, `max_running_requests`, `context_length`).
- TGI `/info`: `model_id`, `max_total_tokens` (the per-request context). `max_concurrent_requests`
  is the router's admission limit, not the batch cap (`--max-batch-size` is on neither endpoint),
  so batch_max_requests stays None.
- llama.cpp `/props`: `total_slots` (= `--parallel`, the batch cap), `model_path`,
  `default_generation_settings.n_ctx` (context per slot).
- trtllm-serve and a Dynamo frontend: OpenAI `/v1/models` (`data[0].id`); their /metrics carry the
  rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INFO_PATHS: dict[str, str] = {
    "vllm": "/v1/models",
    "sglang": "/server_info",
    "tgi": "/info",
    "llamacpp": "/props",
    "trtllm": "/v1/models",
    "dynamo": "/v1/models",
}


@dataclass(frozen=True, slots=True)
class EngineInfoHints:
    """What an info endpoint says; None for whatever it does not."""

    batch_max_requests: int | None = None
    model_id: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int | None = None


def parse_info(engine: str, data: Any) -> EngineInfoHints:
    """Hints from the decoded JSON of INFO_PATHS[engine]. Unknown engine or odd JSON: empty hints."""
    parser = _PARSERS.get(engine)
    if parser is None or not isinstance(data, (dict, list)):
        return EngineInfoHints()
    return parser(data)


def _count(value: Any) -> int | None:
    """A positive whole number (JSON int, or a float/str holding one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _first_model(data: Any) -> dict:
    entries = _dict(data).get("data")
    return _dict(entries[0]) if isinstance(entries, list) and entries else {}


def _openai_models(data: Any) -> EngineInfoHints:
    entry = _first_model(data)
    return EngineInfoHints(
        model_id=_text(entry.get("root")) or _text(entry.get("id")),
        max_model_len=_count(entry.get("max_model_len")),
    )


def _sglang(data: Any) -> EngineInfoHints:
    top = _dict(data)
    states = top.get("internal_states")
    state = _dict(states[0]) if isinstance(states, list) and states else {}
    batch = _count(top.get("max_running_requests"))
    for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
        batch = batch or _count(state.get(key))
    return EngineInfoHints(
        batch_max_requests=batch,
        model_id=_text(top.get("model_path")) or _text(state.get("model_path")),
        max_model_len=_count(top.get("context_length")) or _count(state.get("context_length")),
        tensor_parallel_size=_count(top.get("tp_size")),
    )


def _tgi(data: Any) -> EngineInfoHints:
    top = _dict(data)
    return EngineInfoHints(model_id=_text(top.get("model_id")), max_model_len=_count(top.get("max_total_tokens")))


def _llamacpp(data: Any) -> EngineInfoHints:
    top = _dict(data)
    settings = _dict(top.get("default_generation_settings"))
    return EngineInfoHints(
        batch_max_requests=_count(top.get("total_slots")),
        model_id=_text(top.get("model_path")) or _text(top.get("model_alias")),
        max_model_len=_count(settings.get("n_ctx")),
    )


_PARSERS = {
    "vllm": _openai_models,
    "sglang": _sglang,
    "tgi": _tgi,
    "llamacpp": _llamacpp,
    "trtllm": _openai_models,
    "dynamo": _openai_models,
}
