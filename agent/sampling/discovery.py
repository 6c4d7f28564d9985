"""What an engine says of its model (its info endpoint, each adapter's parse_info; its page's KV dtype), turned into the model constants the agent lacks.

Without --model or --model-config, the model comes from the engine itself: its `config.json` when the
path it reports (vLLM's /v1/models `root`, SGLang's `model_path`, llama.cpp's `model_path`) is readable
from the sidecar (the model volume mounted read-only), else a preset matching the Hugging Face id.

The id is the engine's word: the adapters cut it to collectors.common.MAX_INFO_CHARS, and it is logged
with %r (a newline in it would forge a log line).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rooflight.agent.config.agent import TargetConfig
from rooflight.agent.errors import ConfigError
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import ModelSpec, preset_for_hf_id
from rooflight.collectors.common import cut
from rooflight.collectors.samples import EngineInfo

log = logging.getLogger("rooflight")


def model_from_id(model_id: str | None, target: TargetConfig) -> tuple[ModelSpec, str] | None:
    """(constants, where they came from) for the model an engine reports, or None if unknown."""
    if not model_id:
        return None
    path = Path(model_id)
    config_path = path if path.name == "config.json" else path / "config.json"
    kw: dict[str, Any] = {"weight_dtype": target.weight_dtype, "kv_dtype": target.kv_dtype}
    try:
        if config_path.is_file():
            return load_config_json(config_path, **kw), f"config.json:{config_path}"
    except (ConfigError, OSError) as exc:
        log.warning("target %s: %r is not usable: %r", target.name, str(config_path), exc)
    spec = preset_for_hf_id(model_id)
    if spec is not None:
        return spec.with_dtypes(target.weight_dtype, target.kv_dtype), f"discovered:{cut(model_id)}"
    return None


def with_engine_dtypes(model: ModelSpec | None, info: EngineInfo | None, target: TargetConfig) -> ModelSpec | None:
    """An fp8 KV cache the engine reports halves KV bytes per token, unless the user said otherwise (--kv-dtype)."""
    if model is None or info is None or target.kv_dtype or not info.kv_cache_dtype:
        return model
    if info.kv_cache_dtype.startswith("fp8") and model.kv_dtype != "fp8":
        return model.with_dtypes(None, "fp8")
    return model
