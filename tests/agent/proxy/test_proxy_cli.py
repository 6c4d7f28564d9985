"""`rooflight proxy` flags: a good set becomes a config, a bad one a ConfigError that says what to fix."""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import signal
import subprocess
import sys

import aiohttp
import pytest

from fake_upstream import FakeUpstream, Script

from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy import cli
from rooflight.agent.proxy.catalog import DEFAULT_BUCKETS
from demo_procs import async_child, wait_healthy
from support import ROOT, free_port


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rooflight")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    return parser.parse_args(["proxy", *argv])


def test_flags_become_a_config() -> None:
    args = parse("--upstream", "http://127.0.0.1:8000/", "--listen", "0.0.0.0:8100", "--metrics-listen", ":9750",
                 "--slo", "ttft=0.5,tpot=0.05", "--slo", "ttft=2s,tpot=100ms,e2e=30", "--tenant-header", "X-Tenant-Id",
                 "--tenant-top", "5", "--buckets", "itl=0.004,0.002,0.008", "--windows", "30s,2m",
                 "--percentiles", "50,99.9", "--connect-timeout", "2s", "--read-header-timeout", "5s",
                 "--idle-timeout", "30s", "--max-connections", "100")
    config = cli.config_from_args(args)
    assert config.upstream == "http://127.0.0.1:8000" and config.target == "127.0.0.1:8000"
    assert [s.name for s in config.slos] == ["ttft=0.5,tpot=0.05", "ttft=2,tpot=0.1,e2e=30"]
    assert config.tenant_header == "X-Tenant-Id" and config.tenant_top == 5
    assert config.buckets["itl"] == (0.002, 0.004, 0.008) and config.buckets["ttft"] == DEFAULT_BUCKETS["ttft"]
    assert config.windows == {"30s": 30.0, "2m": 120.0} and config.percentiles == ("50", "99.9")
    assert config.connect_timeout == 2.0 and args.func is cli.cmd_proxy
    assert (config.read_header_timeout, config.idle_timeout) == (5.0, 30.0)
    assert (config.max_connections, config.max_connections_per_client) == (100, 50)  # a share: half the cap


def test_defaults() -> None:
    config = cli.config_from_args(parse("--upstream", "https://llm.internal"))
    assert config.listen == "127.0.0.1:8100" and config.metrics_listen == "127.0.0.1:9748"
    assert config.slos == () and config.tenant_header is None and config.percentiles == ("50", "90", "99")
    assert (config.read_header_timeout, config.idle_timeout) == (10.0, 60.0)
    assert (config.max_connections, config.max_connections_per_client) == (4096, 2048)
    assert config.upstream_auth is None


@pytest.mark.parametrize("argv, says", [
    ([], "--upstream is required"),
    (["--upstream", "127.0.0.1:8000"], "http://HOST:PORT"),
    (["--upstream", "ftp://x"], "http://HOST:PORT"),
    (["--upstream", "http://x:99999"], "port"),
    (["--upstream", "http://x?y=1"], "base URL only"),
    (["--upstream", "http://x", "--listen", "nope"], "HOST:PORT"),
    (["--upstream", "http://x", "--listen", "127.0.0.1:9748"], "its own port"),
    (["--upstream", "http://x", "--slo", "ttft"], "KEY=SECONDS"),
    (["--upstream", "http://x", "--slo", "p99=1"], "keys ttft, tpot, e2e"),
    (["--upstream", "http://x", "--slo", "ttft=1", "--slo", "ttft=1s"], "twice"),
    (["--upstream", "http://x", "--buckets", "ttft"], "NAME=EDGE"),
    (["--upstream", "http://x", "--buckets", "foo=1"], "NAME=EDGE"),
    (["--upstream", "http://x", "--buckets", "ttft=0.1,x"], "not a duration"),
    (["--upstream", "http://x", "--tenant-header", "bad name"], "header name"),
    (["--upstream", "http://x", "--tenant-top", "lots"], "whole number"),
    (["--upstream", "http://x", "--tenant-top", "5000"], "between 0 and 1000"),
    (["--upstream", "http://x", "--windows", ","], "at least one"),
    (["--upstream", "http://x", "--percentiles", "100"], "between 0 and 100"),
    (["--upstream", "http://x", "--connect-timeout", "0"], "more than zero"),
    (["--upstream", "http://x", "--read-header-timeout", "2h"], "between 1ms and 1h"),
    (["--upstream", "http://x", "--idle-timeout", "soon"], "not a duration"),
    (["--upstream", "http://x", "--max-connections", "0"], "between 1 and"),
    (["--upstream", "http://x", "--max-connections", "10", "--max-connections-per-client", "11"], "between 1 and 10"),
    (["--upstream", "http://u:p@x"], "--upstream-credentials-for-anonymous"),
])
def test_bad_flags_say_what_to_fix(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        cli.config_from_args(parse(*argv))


def test_check_only_validates_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.cmd_proxy(parse("--upstream", "http://127.0.0.1:8000", "--slo", "ttft=0.5", "--check-only")) == 0
    out = capsys.readouterr().out
    assert "configuration ok" in out and "ttft=0.5" in out and "http://127.0.0.1:8000" in out


def test_proxy_imports_only_lower_layers() -> None:
    """agent/proxy sits above sampling and below serve: it never imports serve, demo, the CLI, rules or dashboards."""
    allowed = ("rooflight.agent.errors", "rooflight.agent.roofline", "rooflight.agent.signals",
               "rooflight.agent.metrics", "rooflight.agent.config", "rooflight.agent.sampling", "rooflight.agent.proxy",
               "rooflight.collectors")
    files = sorted((ROOT / "agent" / "proxy").glob("*.py"))
    assert files
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{path.name}: {n}" for n in names
                    if n.startswith("rooflight") and not any(n == a or n.startswith(a + ".") for a in allowed)]
    assert bad == []


def test_a_bad_flag_exits_2_with_what_to_fix() -> None:
    done = subprocess.run([sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", "localhost:8000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "write http://HOST:PORT" in done.stderr


@pytest.mark.parametrize("busy_flag", ["--listen", "--metrics-listen"])
def test_a_port_in_use_exits_2_with_what_to_fix(busy_flag: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {"--listen": f"127.0.0.1:{free_port()}", "--metrics-listen": f"127.0.0.1:{free_port()}", busy_flag: busy}
        done = subprocess.run([sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", "http://127.0.0.1:9",
                               *(x for kv in ports.items() for x in kv)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{busy_flag} {busy}: cannot listen there" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def test_the_command_serves_until_sigterm() -> None:
    up = FakeUpstream(scripts={"m": Script(ttft=0.01, gaps=(0.01,) * 3)})
    await up.start()
    port, metrics_port = free_port(), free_port()
    try:
        async with async_child(
                sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", up.url, "--listen", f"127.0.0.1:{port}",
                "--metrics-listen", f"127.0.0.1:{metrics_port}", "--slo", "ttft=1,tpot=0.5", "--log-level", "warning",
        ) as proc:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(session, f"http://127.0.0.1:{metrics_port}/-/healthy")
                body = json.dumps({"model": "m", "stream": True}).encode()
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body) as r:
                    assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
                await asyncio.sleep(1.2)  # one refresh of the exports
                async with session.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    text = await r.text()
            assert 'rooflight_client_slo_good_requests_total{slo="ttft=1,tpot=0.5"' in text
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        await up.stop()
