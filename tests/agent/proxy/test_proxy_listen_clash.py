"""`rooflight proxy --listen 0.0.0.0:8100 --metrics-listen 127.0.0.1:8100 --check-only` said "configuration ok"
and the start then failed to bind (the wildcard holds the port on every address). Check time refuses it now
(exit 2, naming both flags), as `rooflight run` refuses --proxy-listen on the agent's port."""

from __future__ import annotations

import subprocess

import pytest

from rooflight.agent.config.values import listens_clash
from support import rooflight_exe

PROXY = ("proxy", "--upstream", "http://127.0.0.1:8000", "--check-only")


def rooflight(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([rooflight_exe(), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("listen", "metrics"), [("0.0.0.0:8100", "127.0.0.1:8100"), ("127.0.0.1:8100", "0.0.0.0:8100"),
                                                 ("[::]:8100", "127.0.0.1:8100"), (":8100", "10.0.0.1:8100"),
                                                 ("127.0.0.1:8100", "127.0.0.1:8100")])
def test_proxy_refuses_one_port_on_a_wildcard_and_an_address(listen: str, metrics: str) -> None:
    done = rooflight(*PROXY, "--listen", listen, "--metrics-listen", metrics)
    assert done.returncode == 2, (done.stdout, done.stderr)  # before: 0, then a bind error at start
    assert "--listen" in done.stderr and "--metrics-listen" in done.stderr and "own port" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("listen", "metrics"), [("127.0.0.1:8100", "127.0.0.2:8100"), ("0.0.0.0:8100", "127.0.0.1:9748"),
                                                 ("0.0.0.0:0", "127.0.0.1:0")])
def test_proxy_takes_listeners_that_can_both_bind(listen: str, metrics: str) -> None:
    done = rooflight(*PROXY, "--listen", listen, "--metrics-listen", metrics)
    assert done.returncode == 0, done.stderr
    assert "configuration ok" in done.stdout


def test_run_and_proxy_judge_a_clash_alike() -> None:
    assert listens_clash("0.0.0.0:9746", "127.0.0.1:9746") and listens_clash("127.0.0.1:1", "[::]:1")
    assert not listens_clash("127.0.0.1:1", "127.0.0.2:1") and not listens_clash("0.0.0.0:0", "0.0.0.0:0")
    done = rooflight("run", "--engine-url", "http://127.0.0.1:9", "--no-nvml", "--check-only",
                     "--listen", "0.0.0.0:9746", "--proxy-listen", "127.0.0.1:9746")
    assert done.returncode == 2 and "share port 9746" in done.stderr, done.stderr
