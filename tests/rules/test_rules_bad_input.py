"""`rooflight rules` refuses what would render invalid PromQL (exit 2, naming the flag) instead of printing it
with exit 0: a zero or out-of-range duration (`--cluster-absent-for 0s` rendered `absent_over_time(...[0s])`,
`99999999999y` is past what Prometheus parses), a selector that is not label matchers (`{job="x"` was spliced
into every rule), a metric name Prometheus cannot have; and `-o` to a directory or a missing folder, which
raised a traceback."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from rooflight.agent.errors import ConfigError
from rooflight.rules import config as cfg
from support import run_in_process


def rules(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_in_process("rules", *argv)


@pytest.mark.parametrize(("flag", "value", "says"), [
    ("--cluster-absent-for", "0s", "is zero"),
    ("--cluster-absent-for", "0m0s", "is zero"),
    ("--cluster-absent-for", "99999999999y", "is longer than 10y; write at most 10y"),
    ("--cluster-absent-for", "10y1s", "is longer than 10y"),
    ("--cluster-absent-for", "30m1h", "write each unit once, the largest first"),
    ("--agent-absent-for", "5 m", "is not a Prometheus duration"),
    ("--keep-firing-for", "0s", "is zero"),
    ("--hol-for", "0s", "is zero"),
    ("--low-mbu-for", "100y", "is longer than 10y"),
    ("--agent-selector", '{job="x"', "is not label matchers"),
    ("--agent-selector", '{job="x"}', "is not label matchers"),
    ("--agent-selector", "job=x", "is not label matchers"),
    ("--agent-selector", 'job="x",', "is not label matchers"),
    ("--engine-selector", 'job="x" or vector(1)', "is not label matchers"),
    ("--agent-job-selector", "", "is not label matchers"),
    ("--ttft-metric", "1bad metric", "is not a Prometheus metric name"),
    ("--itl-metric", "itl{job=\"x\"}", "is not a Prometheus metric name"),
])
def test_rules_refuses_what_would_render_invalid_promql(flag: str, value: str, says: str) -> None:
    done = rules(flag, value)
    assert done.returncode == 2, (done.stdout[:200], done.stderr)  # before: 0, the rules printed
    assert f"rooflight rules: {flag}: {value!r} {says}" in done.stderr or \
        (flag in done.stderr and says in done.stderr), done.stderr
    assert "Traceback" not in done.stderr and not done.stdout


@pytest.mark.parametrize("argv", [("--agent-selector", 'job="x", namespace=~"llm-.*"'), ("--cluster-absent-for", "10y"),
                                  ("--cluster-absent-for", "1h30m"), ("--keep-firing-for", ""),
                                  ("--ttft-metric", "my:ttft_seconds"), ("--agent-selector", "")])
def test_rules_takes_valid_ones(argv: tuple[str, ...]) -> None:
    done = rules(*argv)
    assert done.returncode == 0, done.stderr
    assert "groups:" in done.stdout


@pytest.mark.parametrize("output", ["/", "/nonexistent/x.yaml"])
def test_rules_says_it_cannot_write_the_output(output: str) -> None:
    done = rules("-o", output)
    assert done.returncode == 2, done.stderr  # before: IsADirectoryError / FileNotFoundError, exit 1
    assert f"-o {output}: cannot write it" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_rules_writes_the_output_it_can(tmp_path: Path) -> None:
    out = tmp_path / "rules.yaml"
    assert rules("-o", str(out)).returncode == 0 and "groups:" in out.read_text()


@pytest.mark.parametrize(("change", "says"), [
    (lambda: replace(cfg.RulesConfig(), cluster_absent_for="0s"), "cluster_absent_for: '0s' is zero"),
    (lambda: replace(cfg.RulesConfig(), agent_selector='{job="x"'), "agent_selector: '{job=\"x\"' is not label matchers"),
    (lambda: replace(cfg.ttft_slo(), histogram="1bad metric"), "ttft histogram: '1bad metric' is not"),
    (lambda: replace(cfg.itl_slo(), selector="job=x"), "itl selector: 'job=x' is not label matchers"),
], ids=["duration", "agent-selector", "histogram", "slo-selector"])
def test_the_config_refuses_them_for_every_caller(change: Callable[[], object], says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        change()
    assert says in str(caught.value)
