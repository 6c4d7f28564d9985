"""The command line as a user meets it: bad input stops the start with what to fix (exit 2), the demo
serves real numbers over HTTP, and the console script is installed."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rooflight.agent import cli
from support import MODEL_CONFIGS, free_port, rooflight_exe

FIXTURES = MODEL_CONFIGS


def rooflight(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    exe = rooflight_exe()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    full_env.update(env or {})
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["run"], {}, "no engine to watch"),
        (["run", "--engine-url", "ftp://x"], {}, "http://HOST:PORT"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--interval", "fast"], {}, "not a duration"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--interval", "30s"], {}, "too coarse"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--gpu", "h900"], {}, "h100-sxm"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--model", "llama-9"], {}, "llama-3-8b"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--model-config", str(FIXTURES / "broken-heads.json")], {}, "config"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--listen", "nowhere"], {}, "HOST:PORT"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--detector", "hol_inflation=0.5"], {}, "hol_inflation"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--detector", "nonsense=1"], {}, "unknown detector"),
        (["run"], {"ROOFLIGHT_ENGINE_URL": "http://127.0.0.1:1", "ROOFLIGHT_INTERVAL": "soon"}, "not a duration"),
        (["demo", "--scenario", "nope"], {}, "head-of-line"),
        (["run", "--engine-url", "http://127.0.0.1:1", "--engine", "ollama"], {}, "sglang"),
    ],
)
def test_bad_input_exits_2_with_what_to_fix(args: list[str], env: dict[str, str], says: str) -> None:
    result = rooflight(*args, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_config_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "rooflight.yaml"
    bad.write_text("targets: [unclosed\n")
    result = rooflight("run", "--config", str(bad))
    assert result.returncode == 2 and "not valid YAML" in result.stderr
    bad.write_text("targets:\n  - name: no-url\n")
    result = rooflight("run", "--config", str(bad))
    assert result.returncode == 2 and "needs a `url`" in result.stderr


def test_check_only_accepts_a_good_config_and_flags_win(tmp_path: Path) -> None:
    good = tmp_path / "rooflight.yaml"
    good.write_text(
        "interval: 2s\nwindows: [10s, 1m]\ntargets:\n"
        "  - {url: 'http://127.0.0.1:8000', name: a, model: llama-3-8b, gpu: h100-sxm}\n"
        "  - {url: 'http://127.0.0.1:8001', name: b, tp: 2}\n"
    )
    result = rooflight("run", "--config", str(good), "--listen", "127.0.0.1:9999", "--check-only",
                       env={"ROOFLIGHT_LISTEN": "0.0.0.0:1"})
    assert result.returncode == 0, result.stderr
    assert "2 target(s), listen 127.0.0.1:9999" in result.stdout


def test_kubernetes_service_links_are_not_settings_and_typos_are_named() -> None:
    env = {"ROOFLIGHT_ENGINE_URL": "http://127.0.0.1:1", "ROOFLIGHT_PORT": "tcp://10.0.0.1:9746",
           "ROOFLIGHT_SERVICE_HOST": "10.0.0.1", "ROOFLIGHT_PORT_9746_TCP_ADDR": "10.0.0.1", "ROOFLIGHT_INTERVALL": "2s"}
    result = rooflight("run", "--check-only", env=env)
    assert result.returncode == 0, result.stderr
    assert "ROOFLIGHT_INTERVALL" in result.stderr and "ROOFLIGHT_SERVICE_HOST" not in result.stderr


def test_help_teaches_what_the_numbers_mean() -> None:
    result = rooflight("run", "--help")
    assert result.returncode == 0
    for words in ("MBU", "MFU", "ROOFLIGHT_ENGINE_URL", "kernel_residency"):
        assert words in result.stdout


def test_every_flag_of_every_command_says_what_it_does() -> None:
    import argparse

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"run", "demo", "proxy", "plan", "rules"} <= set(commands)
    silent = [(name, action.option_strings[-1]) for name, parser in commands.items() for action in parser._actions
              if action.option_strings and not (action.help or "").strip()]
    assert not silent, f"flags without a help line in --help: {silent}"


def test_plan_json_through_the_console_script() -> None:
    import json

    result = rooflight("plan", "--model", "ref-8b", "--gpu", "h100-sxm", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert round(plan["ridge_point"]) == 295 and plan["max_concurrent_sequences"] == 57


def test_demo_serves_the_agent_over_http() -> None:
    port, engine_port = free_port(), free_port()
    proc = subprocess.Popen(
        [rooflight_exe(), "demo", "--listen", f"127.0.0.1:{port}", "--gpu-hour-cost", "3",
         "--engine-listen", f"127.0.0.1:{engine_port}", "--interval", "0.5", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline, body = time.monotonic() + 40, ""
        wanted = ("rooflight_mbu_ratio{", "rooflight_blended_cost_per_million_tokens{")
        while time.monotonic() < deadline and not all(w in body for w in wanted):
            time.sleep(0.5)
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
        assert all(w in body for w in wanted), body[-2000:]
        assert 'rooflight_source_up{source="engine"' in body
        assert re.search(r"^rooflight_gpu_hour_cost\{[^}]*\} 3\.0$", body, re.M)  # the demo prices its GPU-hour too
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
        assert "<title>Rooflight" in page and "/api/v1/status" in page  # the status page, which polls its data
        status = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status", timeout=2).read().decode()
        assert "llama-3-8b" in status
        engine = urllib.request.urlopen(f"http://127.0.0.1:{engine_port}/metrics", timeout=2).read().decode()
        assert "vllm:num_requests_running" in engine
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "serving http://127.0.0.1" in out


def test_demo_refuses_a_price_that_is_not_one() -> None:
    result = rooflight("demo", "--gpu-hour-cost", "-1", "--duration", "1", timeout=30)
    assert result.returncode == 2 and "gpu_hour_cost: must be above 0" in result.stderr, result.stderr[-500:]


def test_a_model_config_from_a_device_exits_2() -> None:
    result = rooflight("plan", "--model-config", "/dev/zero", timeout=30)
    assert result.returncode == 2 and "larger than 16 MiB" in result.stderr, result.stderr[-500:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("module", ["rooflight.agent.plan_cli", "rooflight.rules.generate"])
def test_a_broken_subcommand_module_stops_the_cli_instead_of_dropping_its_command(
        module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` and `rules` always ship: an ImportError in them is a bug to see, not a command to hide."""
    import importlib

    from rooflight.agent import cli

    def broken(sub: object) -> None:
        raise ImportError("cannot import name 'gone' (a bug in the module)")

    monkeypatch.setattr(importlib.import_module(module), "register", broken)
    with pytest.raises(ImportError, match="a bug in the module"):
        cli.build_parser()


def test_expert_parallelism_on_a_dense_model_exits_2_and_on_a_moe_model_starts() -> None:
    dense = rooflight("run", "--engine-url", "http://127.0.0.1:1", "--model", "llama-3-8b", "--ep", "8",
                      "--check-only", timeout=30)
    assert dense.returncode == 2, dense.stderr
    assert "llama-3-8b is dense" in dense.stderr and "Traceback" not in dense.stderr
    moe = rooflight("run", "--engine-url", "http://127.0.0.1:1", "--model", "mixtral-8x7b", "--ep", "2",
                    "--check-only", timeout=30)
    assert moe.returncode == 0, moe.stderr


def test_tests_find_the_console_script_beside_the_interpreter_not_on_path() -> None:
    """`.venv/bin/python -m pytest` without the venv on PATH is how most people run the suite: a test that
    looks `rooflight` up on PATH fails there. support.rooflight_exe() finds it beside sys.executable."""
    tests = Path(__file__).resolve().parents[1]
    lookup = "which(" + '"rooflight")'  # spelt in two pieces: this file is read too
    on_path = [str(p.relative_to(tests)) for p in tests.rglob("*.py")
               if p.name != "support.py" and lookup in p.read_text()]
    assert on_path == []
