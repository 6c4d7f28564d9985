"""`rooflight plan` refuses a flag it cannot work with (exit 2, naming the flag and its range) before any
arithmetic: `--prompt 0` divided by zero, `--prompt nan` and `--reserved-gb nan` raised ValueError, `--rate 1e20`
overflowed and `--rate 1e50` divided by zero in the queueing maths (tracebacks, exit 1); `--reserved-gb -5` was
worked as given, `--decode-capacity 1e-300` printed 300-digit group counts and `--ep 2` on a dense model was
accepted where `rooflight run` refuses it."""

from __future__ import annotations

import subprocess

import pytest

from rooflight.agent.roofline.plan import sig
from support import run_in_process

POOLS = ("--rate", "10", "--prompt", "1000", "--output", "200")


def plan(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_in_process("plan", *argv)


def _without(flags: tuple[str, ...], flag: str) -> tuple[str, ...]:
    i = flags.index(flag)
    return flags[:i] + flags[i + 2:]


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--prompt", "0", "--prompt 0: write mean prompt tokens per request, from 1 to 1,073,741,824"),
    ("--prompt", "-5", "--prompt -5: write mean prompt tokens per request, from 1"),
    ("--prompt", "nan", "--prompt nan: not a number"),
    ("--prompt", "1e300", "--prompt 1e+300: write mean prompt tokens per request"),
    ("--output", "0", "--output 0: write mean output tokens per request"),
    ("--output", "inf", "--output inf: not a number"),
    ("--rate", "1e20", "--rate 1e+20: write requests per second, from 1e-06 to 1,000,000,000,000"),
    ("--rate", "1e50", "--rate 1e+50: write requests per second"),
    ("--rate", "0", "--rate 0: write requests per second"),
    ("--rate", "-1", "--rate -1: write requests per second"),
    ("--rate", "1e-300", "--rate 1e-300: write requests per second"),
    ("--reserved-gb", "nan", "--reserved-gb nan: not a number"),
    ("--reserved-gb", "-5", "--reserved-gb -5: write GB per GPU, from 0 to 10,000"),
    ("--reserved-gb", "1e300", "--reserved-gb 1e+300: write GB per GPU"),
    ("--decode-capacity", "1e-300", "--decode-capacity 1e-300: write decode tokens/s one group carries, from 1 to"
                                    " 1,000,000,000"),
    ("--prefill-capacity", "1e-300", "--prefill-capacity 1e-300: write prefill tokens/s one group carries"),
    ("--prefill-capacity", "nan", "--prefill-capacity nan: not a number"),
    ("--itl-slo", "0", "--itl-slo 0: write seconds, from 0.001 to 86,400"),
    ("--ttft-slo", "1e300", "--ttft-slo 1e+300: write seconds"),
    ("--decode-mbu", "nan", "--decode-mbu nan: not a number"),
    ("--prefill-mfu", "2", "--prefill-mfu 2: write a fraction of the compute peak"),
    ("--output-cv", "-1", "--output-cv -1: write the output lengths' standard deviation / their mean, from 0 to 10"),
])
def test_plan_refuses_a_flag_out_of_its_range_naming_it(flag: str, value: str, says: str) -> None:
    args = (*_without(POOLS, flag), flag, value) if flag in POOLS else (*POOLS, flag, value)
    done = plan(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert max(map(len, done.stderr.split())) < 60  # no 300-digit number echoed


@pytest.mark.parametrize("argv", [("--reserved-gb", "nan"), ("--reserved-gb", "-5"), ("--prefill-mfu", "nan")])
def test_the_calculator_alone_refuses_them_too(argv: tuple[str, ...]) -> None:
    done = plan(*argv)
    assert done.returncode == 2 and argv[0] in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_reserve_that_leaves_no_memory_says_so_not_that_the_weights_do_not_fit() -> None:
    done = plan("--reserved-gb", "1000")  # ref-8b: 16 GB of weights on an 80 GB H100
    assert done.returncode == 0, done.stderr
    assert "the weights alone exceed" not in done.stdout
    assert "the 1,000 GB reserved (--reserved-gb) leaves no memory for the KV cache beside 16 GB of weights" \
        in done.stdout, done.stdout
    assert "the weights alone exceed" in plan("--model", "ref-70b").stdout  # 140 GB of weights: they do
    done = plan(*POOLS, "--reserved-gb", "78")
    assert done.returncode == 2 and "(--reserved-gb)" in done.stderr and "lower --reserved-gb" in done.stderr, \
        done.stderr


@pytest.mark.parametrize("argv", [("--model", "llama-3-8b", "--ep", "2"),
                                  ("--model", "llama-3-8b", "--ep", "2", *POOLS)])
def test_plan_refuses_ep_on_a_dense_model_as_run_does(argv: tuple[str, ...]) -> None:
    done = plan(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert ("--ep 2: llama-3-8b is dense (no routed experts), and expert parallelism splits only the experts of a"
            " MoE model; drop ep, or give the MoE model it serves (--model / --model-config)") in done.stderr
    run = run_in_process("run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--check-only",
                         "--model", "llama-3-8b", "--ep", "2")
    assert run.returncode == 2 and done.stderr.split("--ep 2")[1].strip() in run.stderr, run.stderr
    assert plan("--model", "mixtral-8x7b", "--ep", "2", "--tp", "2").returncode == 0


def test_a_fleet_past_a_trillion_groups_is_refused_not_printed() -> None:
    done = plan("--rate", "1e12", "--prompt", "1", "--output", "1073741824", "--decode-capacity", "1",
                "--prefill-capacity", "1e9")
    assert done.returncode == 2 and "groups' work, more than 1,000,000,000,000" in done.stderr, done.stderr


@pytest.mark.parametrize(("x", "s"), [(1e20, "1e+20"), (-3e300, "-3e+300"), (999e12, "999,000,000,000,000")])
def test_sig_writes_a_huge_number_in_a_few_characters(x: float, s: str) -> None:
    assert sig(x) == s
