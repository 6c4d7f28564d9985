"""A model's constants from what the user names: a preset, a Hugging Face id, or a config.json on disk.

The one place the agent reads a model's config.json (agent/roofline is pure: it turns the parsed JSON into a
ModelSpec, models.from_hf_config); `rooflight run`, `rooflight plan` and discovery from an engine's /v1/models
all come through here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.config_reader import ConfigReader
from rooflight.agent.roofline.models import ModelSpec, from_hf_config, preset, preset_for_hf_id

MAX_CONFIG_JSON_BYTES = 16 * 1024 * 1024  # real config.json files are a few KiB; /dev/zero never ends


def _read_json(p: Path) -> Any:
    """The JSON at `p`, reading at most MAX_CONFIG_JSON_BYTES (a device or a wrong file is not read to the end)."""
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_JSON_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read model config {p}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_JSON_BYTES:
        raise ConfigError(f"model config {p}: larger than {MAX_CONFIG_JSON_BYTES // (1024 * 1024)} MiB;"
                          " give the model's config.json (a few KiB)")
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"model config {p} is not valid JSON: {e}") from None


def load_config_json(path: str | Path, **kw: Any) -> ModelSpec:
    """Read a config.json (or a model directory holding one); ConfigError if unreadable or bad.

    A ModelOpt checkpoint whose config.json has no quantization_config keeps it in the
    hf_quant_config.json beside it (vLLM reads it there too); it is merged in.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = _read_json(p)
    sidecar = p.parent / "hf_quant_config.json"
    if isinstance(cfg, dict) and cfg.get("quantization_config") is None and sidecar.is_file():
        quant = ConfigReader(_read_json(sidecar), f"{sidecar}").mapping("quantization")
        if quant is not None:
            cfg = {**cfg, "quantization_config": {"quant_method": "modelopt", **quant.cfg}}
    kw.setdefault("name", (p.parent.name if p.name == "config.json" else "") or p.stem)
    return from_hf_config(cfg, source=f"config.json:{p}", **kw)


def resolve_model(model: str | None, model_config: str | None, weight_dtype: str | None,
                  kv_dtype: str | None) -> ModelSpec:
    """--model-config wins; --model is a preset name or a Hugging Face id that maps to one."""
    if model_config:  # the overrides replace what the config says, so an unsized scheme still plans
        return load_config_json(model_config, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    else:
        name = model or "ref-8b"
        try:
            spec = preset(name)
        except ConfigError:
            found = preset_for_hf_id(name)
            if found is None:
                raise
            spec = found
    return spec.with_dtypes(weight_dtype, kv_dtype)
