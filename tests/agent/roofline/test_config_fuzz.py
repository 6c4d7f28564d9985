"""Hostile config.json values: every field goes through one validated reader, so `rooflight plan`
and `rooflight run` exit 2 with what to fix, never a traceback (exit 1)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rooflight.agent.cli import main
from rooflight.agent.errors import ConfigError
from rooflight.agent.roofline.config_reader import ConfigReader, describe
from rooflight.agent.model_files import load_config_json
from rooflight.agent.roofline.models import _FIELDS
from support import MODEL_CONFIGS

BASES = ("llama-3-8b.json", "mistral-7b-v0.1.json", "gemma-2-9b.json", "deepseek-v3-mla.json",
         "mixtral-8x7b-moe.json", "llama-3.3-70b-nvfp4.json", "llama-3.1-8b-fp8-compressed-tensors.json",
         "qwen2.5-7b-gptq-int8.json", "gemma-3-27b-it.json")
QUANT_KEYS = ("quant_method", "quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules", "bits",
              "w_bit", "config_groups", "ignore", "kv_cache_scheme", "weight_block_size", "load_in_4bit",
              "modules_to_not_convert", "q_group_size")


def run_cli(*argv: str) -> tuple[int, str]:
    """The CLI's main in-process; an uncaught exception (a traceback) fails the test by itself."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def base(name: str) -> dict:
    return json.loads((MODEL_CONFIGS / name).read_text())


@pytest.mark.parametrize("patch,says", [
    ({"vocab_size": 10**400}, "vocab_size must be a whole number from 1 to 100,000,000, got a 401-digit integer"),
    ({"num_attention_heads": "32"}, "num_attention_heads must be a whole number"),
    ({"num_key_value_heads": [8]}, "num_key_value_heads must be a whole number"),
    ({"mlp_only_layers": 5}, "mlp_only_layers must be a list"),
    ({"layer_types": "sliding_attention"}, "layer_types must be a list"),
    ({"head_dim": 0}, "head_dim must be a whole number from 1"),
    ({"num_hidden_layers": 1e30}, "num_hidden_layers must be a whole number from 1 to 10,000, got 1e+30"),
    ({"num_hidden_layers": 32.0}, "num_hidden_layers must be a whole number"),
    ({"hidden_size": True}, "hidden_size must be a whole number"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"torch_dtype": 16}, "torch_dtype must be a string"),
    ({"torch_dtype": "float64"}, "unknown dtype"),
    ({"sliding_window": 0}, "sliding_window must be a whole number from 1"),
    ({"quantization_config": "fp8"}, "quantization_config must be a JSON object"),
    ({"quantization_config": {"quant_method": "gptq", "bits": "8"}}, "quantization_config.bits must be"),
    ({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": []}},
     "config_groups must be a JSON object"),
    ({"quantization_config": {"quant_method": "fp8", "modules_to_not_convert": ["re:(("]}}, "not a valid regex"),
    ({"text_config": 7}, "text_config must be a JSON object"),
])
def test_hostile_values_exit_2_naming_the_field(tmp_path: Path, patch: dict, says: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base("llama-3-8b.json"), **patch}))
    code, err = run_cli("plan", "--model-config", str(path))
    assert code == 2 and says in err, err
    code, err = run_cli("run", "--engine-url", "http://127.0.0.1:1", "--model-config", str(path), "--check-only")
    assert code == 2 and says in err, err


def test_non_object_and_non_json_configs(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    for text, says in (("[1, 2]", "must be a JSON object"), ("[" * 100_000, "not valid JSON"),
                       ("1" * 5000, "not valid JSON"), ("NaN", "must be a JSON object")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=says):
            load_config_json(path)


def test_describe_names_huge_numbers_and_cuts_long_text() -> None:
    assert describe(10**400) == "a 401-digit integer"
    assert describe("x" * 500).endswith("...") and len(describe("x" * 500)) == 60
    assert describe(math.inf) == "inf"


def test_every_known_field_is_checked_even_when_unused() -> None:
    dense = ConfigReader({**base("llama-3-8b.json"), "first_k_dense_replace": -1}, "t")
    from rooflight.agent.roofline.models import validate_fields
    with pytest.raises(ConfigError, match="first_k_dense_replace"):
        validate_fields(dense)  # a dense model never reads it, the reader still refuses it


scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.sampled_from([0, 1, -1, 2, 8, 16, 128, 4096, 10**400, 2**63])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["bfloat16", "float32", "fp8", "sliding_attention", "full_attention", "Linear",
                              "re:.*", "lm_head", "NVFP4", "FP8", "gptq", "compressed-tensors", "modelopt"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8) | st.sampled_from(QUANT_KEYS), inner, max_size=4),
                      max_leaves=12)
fields = st.dictionaries(st.sampled_from(sorted(_FIELDS)), values, min_size=1, max_size=4)
quant_fields = st.dictionaries(st.sampled_from(QUANT_KEYS), values, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(BASES), patch=fields, quant=quant_fields)
def test_fuzzed_config_json_never_gives_a_traceback(tmp_path: Path, name: str, patch: dict, quant: dict) -> None:
    cfg = {**base(name), **patch}
    if quant:
        q = cfg.get("quantization_config")
        cfg["quantization_config"] = {**(q if isinstance(q, dict) else {}), **quant}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, err = run_cli("plan", "--model-config", str(path), "--json")
    assert code in (0, 2), err
    assert (code == 2) == err.startswith("rooflight: ")
