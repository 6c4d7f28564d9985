"""`weight_dtype` and `kv_dtype` are checked when the settings are read: `rooflight run --weight-dtype fp3
--check-only` said "configuration ok" (exit 0) and the engine loop later stopped with a traceback (ConfigError:
unknown dtype, from agent/sampling/discovery.py). Now the start stops, exit 2, naming the flag, with or
without --model, from a flag, the environment or the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import clean_env, run_in_process

RUN = ("run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--check-only")


@pytest.mark.parametrize("flag", ["--weight-dtype", "--kv-dtype"])
@pytest.mark.parametrize("model", [(), ("--model", "llama-3-8b")], ids=["no-model", "model"])
@pytest.mark.parametrize("value", ["fp3", "bogus", ""])
def test_run_refuses_an_unknown_dtype_at_start(flag: str, model: tuple[str, ...], value: str) -> None:
    done = run_in_process(*RUN, *model, flag, value)
    assert done.returncode == 2, (done.stdout, done.stderr)  # before: 0 without --model, a traceback later
    assert flag in done.stderr and "write one of" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("flag", "value"), [("--weight-dtype", "bfloat16"), ("--weight-dtype", "fp8"),
                                             ("--kv-dtype", "fp8_e4m3"), ("--kv-dtype", "bf16")])
def test_run_takes_the_dtypes_and_aliases_the_roofline_knows(flag: str, value: str) -> None:
    done = run_in_process(*RUN, "--model", "llama-3-8b", flag, value)
    assert done.returncode == 0, done.stderr
    assert "configuration ok" in done.stdout


def test_the_environment_and_the_config_file_are_checked_alike(tmp_path: Path) -> None:
    done = run_in_process(*RUN, env=clean_env(ROOFLIGHT_WEIGHT_DTYPE="fp3"))
    assert done.returncode == 2 and "weight_dtype (--weight-dtype): unknown dtype 'fp3'" in done.stderr, done.stderr
    config = tmp_path / "rooflight.yaml"
    config.write_text("kv_dtype: fp3\n")
    done = run_in_process(*RUN, "--config", str(config))
    assert done.returncode == 2 and "kv_dtype (--kv-dtype): unknown dtype 'fp3'" in done.stderr, done.stderr
