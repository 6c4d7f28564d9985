"""Every count a user sets has a range that fits the model and the GPUs; past it the start stops (exit 2) and
says what to write.

`--tp 1000000000000000000000` and `--batch-max` of 31 digits were exported as given (rooflight_batch_max_requests
1e+30), and `--ep 100000000000000000000` passed `--check-only` for Mixtral's 8 experts: positive_int had no
upper bound, and nothing checked the model. Through the real CLI (`rooflight run --check-only`, `rooflight
plan`), flags, the environment and the config file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rooflight.agent import cli
from rooflight.agent.errors import ConfigError
from rooflight.collectors.common import MAX_BATCH, MAX_TENSOR_PARALLEL
from support import clean_env, run_in_process

BIG = "1" + "0" * 20  # 1e20, as digits: a whole number argparse's int accepts


RUN = ("run", "--engine-url", "http://127.0.0.1:8000", "--no-nvml", "--check-only")


@pytest.mark.parametrize(("argv", "says"), [
    (["--tp", BIG + "0"], f"tp: {BIG}0 is more than {MAX_TENSOR_PARALLEL:,}"),
    (["--batch-max", "1" + "0" * 30], f"batch_max: 1{'0' * 30} is more than {MAX_BATCH:,}"),
    (["--ep", BIG, "--model", "mixtral-8x7b"], "ep: 100000000000000000000 is more than"),
    (["--ep", "64", "--tp", "2", "--model", "mixtral-8x7b"],
     "ep 64 over tp 2 is 32 expert groups, but mixtral-8x7b has 8 routed experts"),
    (["--ep", "16384", "--model", "mixtral-8x7b"], "has 8 routed experts"),
    (["--tp", "3", "--model", "llama-3-8b"], "tp 3: llama-3-8b's 32 attention heads cannot be split over 3 GPUs"),
    (["--pid", BIG], "pid: 100000000000000000000 is more than"),
])
def test_run_refuses_a_count_past_its_range_with_what_to_write(argv: list[str], says: str) -> None:
    done = run_in_process(*RUN, *argv)
    assert done.returncode == 2, (done.stdout, done.stderr)  # before: 0, "configuration ok"
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_environment_and_the_config_file_are_held_to_the_same_ranges(tmp_path: Path) -> None:
    done = run_in_process(*RUN, env=clean_env(ROOFLIGHT_BATCH_MAX="2000000"))
    assert done.returncode == 2 and "batch_max: 2000000 is more than" in done.stderr, done.stderr
    for line, says in (("tp: 1.0e+21", "tp: 1000000000000000000000 is more than"),
                       ("max_series: 1000000000", "max_series: 1000000000 is more than"),
                       ("max_body_bytes: 1000000000000000", "max_body_bytes: 1000000000000000 is more than"),
                       ("max_connections: 1000000000000", "max_connections: 1000000000000 is more than"),
                       ("targets:\n  - {url: 'http://127.0.0.1:8001', tp: 5000}", "tp: 5000 is more than")):
        path = tmp_path / "rooflight.yaml"
        path.write_text("engine_url: http://127.0.0.1:8000\n" + line + "\n" if "targets" not in line else line + "\n")
        with pytest.raises(ConfigError, match=says.replace("+", r"\+")):
            cli.load_config(cli.build_parser().parse_args(["run", "--config", str(path)]), environ={})


@pytest.mark.parametrize("argv", [
    ["--tp", "8", "--ep", "64", "--model", "mixtral-8x7b"],  # 8 expert groups of one expert each
    ["--tp", "8", "--model", "llama-3-8b"],
    ["--ep", "256", "--model", "deepseek-v3"],  # TP from the engine: up to 256 x its TP
    ["--batch-max", str(MAX_BATCH), "--tp", str(MAX_TENSOR_PARALLEL)],
])
def test_counts_within_their_range_pass(argv: list[str]) -> None:
    done = run_in_process(*RUN, *argv)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("argv", "says"), [
    (["--tp", BIG], f"--tp {BIG}: at most {MAX_TENSOR_PARALLEL:,}"),
    (["--ep", BIG, "--model", "mixtral-8x7b"], "--ep 100000000000000000000 over --tp 1 is"),
    (["--batch", "1" + "0" * 30], "--batch 1" + "0" * 30 + ": at most"),
    (["--context", "1" + "0" * 30], "--context 1" + "0" * 30 + ": at most"),
    (["--prompt-tokens", "1" + "0" * 30], "--prompt-tokens 1" + "0" * 30 + ": at most"),
    (["--batch-max", "1" + "0" * 30, "--rate", "1", "--prompt", "100", "--output", "100"], "--batch-max 1" + "0" * 30 + ": at most"),
])
def test_plan_refuses_a_count_past_its_range(argv: list[str], says: str) -> None:
    done = run_in_process("plan", *argv)
    assert done.returncode == 2, (done.stdout[-300:], done.stderr)  # before: 0, figures for the absurd setting
    assert says in done.stderr, done.stderr
