"""`rooflight run --proxy-listen`: one sidecar, one /metrics with the engine's view and the client's.

Over real HTTP on 127.0.0.1: a fake vLLM that serves a recorded /metrics page and streams chat
completions; the agent's serve() (and, once, the `rooflight run` command) with the proxy in front of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import AsyncIterator

import aiohttp
import psutil
import pytest
from aiohttp import web

from rooflight.agent import cli
from rooflight.agent.errors import ConfigError
from rooflight.agent.proxy.config import for_agent
from rooflight.agent.config import agent as cfg
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve import server
from demo_procs import async_child
from support import free_port, promtool_clean, rooflight_exe, sample_text, serve_app, serve_task

TOKENS = ("Hel", "lo", " there")
GAP = 0.02


class Engine:
    """A vLLM on 127.0.0.1: a recorded /metrics page, and chat streams of TOKENS, GAP seconds apart."""

    def __init__(self) -> None:
        self.page = sample_text("vllm-cpu-rest-fresh.prom")
        self.streamed: list[bytes] = []  # each stream's bytes as sent
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, self.url = await serve_app(app, shutdown_timeout=0.2)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/plain")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        sent = b""
        for i, token in enumerate(TOKENS):
            await asyncio.sleep(GAP)
            delta = {"choices": [{"index": 0, "delta": {"content": token},
                                  "finish_reason": "stop" if i == len(TOKENS) - 1 else None}]}
            event = f"data: {json.dumps(delta)}\n\n".encode()
            await response.write(event)
            sent += event
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(TOKENS), "total_tokens": 8}}
        tail = f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
        await response.write(tail)
        self.streamed.append(sent + tail)
        await response.write_eof()
        return response


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    e = Engine()
    await e.start()
    try:
        yield e
    finally:
        await e.stop()


def run_args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["run", *argv])


def agent_config(*argv: str, environ: dict[str, str] | None = None) -> cfg.AgentConfig:
    return cli.load_config(run_args(*argv), environ=environ or {})


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as r:
        return r.status, await r.text()


async def _wait_for(session: aiohttp.ClientSession, url: str, needle: str, timeout: float = 20.0) -> str:
    """GET `url` until its body holds `needle` (the agent samples and the proxy refreshes every interval)."""
    deadline = asyncio.get_running_loop().time() + timeout
    text = ""
    while asyncio.get_running_loop().time() < deadline:
        try:
            _, text = await _get(session, url)
        except aiohttp.ClientError:
            text = ""
        if needle in text:
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{needle!r} not in {url} within {timeout} s; last body:\n{text[-2000:]}")


async def _stream(session: aiohttp.ClientSession, base: str) -> bytes:
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    async with session.post(f"{base}/v1/chat/completions", data=body,
                            headers={"Content-Type": "application/json", "X-Tenant": "acme"}) as r:
        assert r.status == 200
        return await r.read()


def _value(text: str, prefix: str) -> float:
    """The value of the one sample whose line starts with `prefix` (name and labels as exported)."""
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    return float(lines[0].rsplit(" ", 1)[1])


@pytest.fixture
async def serving(engine: Engine) -> AsyncIterator[tuple[str, str, asyncio.Task[None]]]:
    """serve() with the proxy, configured as `rooflight run` would be; (agent URL, proxy URL, task)."""
    port, proxy_port = free_port(), free_port()
    config = agent_config("--engine-url", engine.url, "--target-name", "pod-a", "--listen", f"127.0.0.1:{port}",
                          "--interval", "0.2", "--windows", "10s,1m", "--no-nvml", "--no-process",
                          "--proxy-listen", f"127.0.0.1:{proxy_port}", "--slo", "ttft=1,tpot=0.5",
                          "--slo", "ttft=0.001", "--tenant-header", "X-Tenant")
    async with serve_task(Agent(config), port, proxy=for_agent(config)) as task:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxy_port}", task


async def test_a_request_through_the_proxy_is_on_the_agents_metrics_beside_the_engines(
    engine: Engine, serving: tuple[str, str, asyncio.Task[None]],
) -> None:
    agent_url, proxy_url, task = serving
    async with aiohttp.ClientSession() as session:
        await _wait_for(session, f"{agent_url}/metrics", 'rooflight_source_up{source="engine",target="pod-a"} 1.0')
        got = await _stream(session, proxy_url)
        assert got == engine.streamed[0]  # relayed unchanged
        text = await _wait_for(session, f"{agent_url}/metrics", "rooflight_client_requests_total{")
    assert not task.done()
    # The client's view, labelled with the engine target's own name so the two views join on `target`.
    requests = 'rooflight_client_requests_total{finish_reason="stop",route="chat",status="200",stream="true",target="pod-a"'
    assert _value(text, requests) == 1.0
    assert _value(text, 'rooflight_client_output_tokens_total{counted_by="usage",target="pod-a"') == len(TOKENS)
    assert _value(text, 'rooflight_client_slo_requests_total{slo="ttft=1,tpot=0.5",target="pod-a"') == 1.0
    assert _value(text, 'rooflight_client_slo_good_requests_total{slo="ttft=1,tpot=0.5",target="pod-a"') == 1.0
    # The first token needs at least GAP (20 ms): never within 1 ms.
    assert _value(text, 'rooflight_client_slo_good_requests_total{slo="ttft=0.001",target="pod-a"') == 0.0
    assert 'rooflight_client_ttft_seconds{percentile="50",target="pod-a",window="1m"}' in text
    ttft_count = _value(text, 'rooflight_client_time_to_first_token_seconds_count{route="chat",target="pod-a"}')
    assert ttft_count == 1.0
    # The engine's view is still there, from the recorded vLLM page.
    assert 'rooflight_source_up{source="engine",target="pod-a"} 1.0' in text
    assert "rooflight_requests_running{" in text and 'target="pod-a"' in text.split("rooflight_requests_running{")[1]
    assert "rooflight_build_info{" in text
    promtool_clean(text)  # one page, two registries' families: still a valid exposition


async def test_the_proxys_gaps_reach_the_head_of_line_detector_of_the_target_it_fronts(engine: Engine) -> None:
    """One clock, one feed: each gap the proxy relays (in a process of its own) is what the fronted target's
    detector reads, a tenth of a second later at most (workers.GAPS_EVERY_SECONDS; a second allowed here)."""
    port, proxy_port = free_port(), free_port()
    config = agent_config("--engine-url", engine.url, "--target-name", "pod-a", "--listen", f"127.0.0.1:{port}",
                          "--interval", "0.2", "--no-nvml", "--no-process", "--proxy-listen", f"127.0.0.1:{proxy_port}")
    agent = Agent(config)
    async with serve_task(agent, port, proxy=for_agent(config)):
        async with aiohttp.ClientSession() as session:
            text = await _wait_for(session, f"{agent_url(port)}/metrics", "rooflight_head_of_line_source{")
            await _stream(session, f"http://127.0.0.1:{proxy_port}")
            streamed = agent.clock.monotonic()
            (loop,) = agent.engines
            assert loop.client_gaps is not None
            worst = None
            while worst is None and agent.clock.monotonic() < streamed + 1.0:
                await asyncio.sleep(0.02)
                now = agent.clock.monotonic()
                worst = loop.client_gaps.worst_between(now - 5.0, now)
            assert loop.client_gaps.loop_lag.worst_between(now - 1.0, now) is not None  # the loop's lateness probe runs
    assert worst is not None and GAP * 0.9 <= worst < 1.0  # the engine sleeps GAP between tokens
    # Until the proxy's gaps span the baseline's 30 s, the engine's buckets judge, and say so.
    sources = {line.split('source="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
               for line in text.splitlines() if line.startswith("rooflight_head_of_line_source{")}
    assert sources == {"engine": 1.0, "proxy": 0.0}


def agent_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


async def test_the_tenant_header_is_hashed_on_the_agents_metrics(serving: tuple[str, str, asyncio.Task[None]]) -> None:
    agent_url, proxy_url, _ = serving
    async with aiohttp.ClientSession() as session:
        await _wait_for(session, f"{agent_url}/-/healthy", "OK")
        await _stream(session, proxy_url)
        text = await _wait_for(session, f"{agent_url}/metrics", "rooflight_client_requests_total{")
    assert "acme" not in text
    tenants = {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
               if line.startswith("rooflight_client_requests_total{")}
    assert len(tenants) == 1 and len(tenants.pop()) == 12  # a 12-hex-digit hash, never the value


async def test_a_proxy_port_in_use_stops_the_start_with_what_to_fix(engine: Engine) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        port = free_port()
        config = agent_config("--engine-url", engine.url, "--listen", f"127.0.0.1:{port}", "--no-nvml",
                              "--no-process", "--proxy-listen", f"127.0.0.1:{busy}")
        agent = Agent(config)
        with pytest.raises(ConfigError, match=f"proxy_listen: listen address 127.0.0.1:{busy}: the port is already in use"):
            await asyncio.wait_for(server.serve(agent, "127.0.0.1", port, proxy=for_agent(config)), 20)
    assert agent.snapshot.created == 0.0  # the agent never started
    with socket.socket() as again:  # and the agent's own port was released
        again.bind(("127.0.0.1", port))


async def test_the_run_command_serves_both_views_and_stops_on_sigterm(engine: Engine) -> None:
    port, proxy_port = free_port(), free_port()
    exe = rooflight_exe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    env.update({"ROOFLIGHT_SLO": "ttft=1,tpot=0.5;e2e=30", "ROOFLIGHT_PROXY_LISTEN": f"127.0.0.1:{proxy_port}"})
    async with async_child(
            exe, "run", "--engine-url", engine.url, "--listen", f"127.0.0.1:{port}", "--no-nvml", "--no-process",
            "--interval", "0.5", "--log-level", "warning", env=env,
    ) as proc:
        async with aiohttp.ClientSession() as session:
            await _wait_for(session, f"http://127.0.0.1:{port}/metrics", 'rooflight_source_up{source="engine"', 40)
            got = await _stream(session, f"http://127.0.0.1:{proxy_port}")
            assert got.endswith(b"data: [DONE]\n\n")
            text = await _wait_for(session, f"http://127.0.0.1:{port}/metrics", "rooflight_client_slo_good_requests_total{")
        target = engine.url.split("//", 1)[1]
        # The relay is a process of its own (the agent's pages never hold its GIL), a child of the agent's
        relays = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
        assert len(relays) == 1, relays
        assert _value(text, f'rooflight_client_slo_good_requests_total{{slo="e2e=30",target="{target}"') == 1.0
        assert _value(text, f'rooflight_client_slo_requests_total{{slo="ttft=1,tpot=0.5",target="{target}"') == 1.0
        assert f'rooflight_source_up{{source="engine",target="{target}"}} 1.0' in text
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert not relays[0].is_running() or relays[0].status() == psutil.STATUS_ZOMBIE  # stopped with it
        out = (await proc.stdout.read()).decode()  # type: ignore[union-attr]
        assert f"proxy on http://127.0.0.1:{proxy_port} -> {engine.url}" in out
        with socket.socket() as again:  # the proxy's port is free again
            again.bind(("127.0.0.1", proxy_port))


# -- settings: flags, environment, file; a bad one says what to fix ---------------------------------------


def test_the_proxy_is_off_unless_proxy_listen_is_set() -> None:
    config = agent_config("--engine-url", "http://127.0.0.1:8000")
    assert config.proxy_listen is None and for_agent(config) is None


def test_flags_become_the_proxys_config_with_the_agents_windows_and_target_name() -> None:
    config = agent_config("--engine-url", "http://user:secret@127.0.0.1:8000/", "--target-name", "pod-a",
                          "--proxy-listen", "0.0.0.0:8100", "--slo", "ttft=0.5,tpot=50ms", "--slo", "e2e=30",
                          "--tenant-header", "X-Tenant-Id", "--tenant-top", "3", "--proxy-buckets", "itl=0.004,0.002",
                          "--windows", "10s,2m", "--percentiles", "50,99.9", "--interval", "2s", "--listen", ":9999")
    proxy = for_agent(config)
    assert proxy is not None
    assert proxy.upstream == "http://127.0.0.1:8000"  # the engine's URL without its user:password
    assert proxy.target == "pod-a" and proxy.listen == "0.0.0.0:8100" and proxy.metrics_listen == ":9999"
    assert [s.name for s in proxy.slos] == ["ttft=0.5,tpot=0.05", "e2e=30"]
    assert proxy.tenant_header == "X-Tenant-Id" and proxy.tenant_top == 3
    assert proxy.buckets["itl"] == (0.002, 0.004)
    assert proxy.windows == {"10s": 10.0, "2m": 120.0} and proxy.percentiles == ("50", "99.9")
    assert proxy.refresh == 2.0


def test_an_upstream_elsewhere_is_labelled_by_its_own_host_and_port() -> None:
    config = agent_config("--engine-url", "http://127.0.0.1:8000", "--target-name", "pod-a",
                          "--proxy-listen", ":8100", "--proxy-upstream", "http://10.0.0.5:9000/")
    proxy = for_agent(config)
    assert proxy is not None and proxy.upstream == "http://10.0.0.5:9000" and proxy.target == "10.0.0.5:9000"


def test_environment_twins_and_config_file_keys(tmp_path: Path) -> None:
    env = {"ROOFLIGHT_PROXY_LISTEN": "127.0.0.1:8100", "ROOFLIGHT_SLO": "ttft=0.5,tpot=0.05; ttft=2,tpot=0.1",
           "ROOFLIGHT_TENANT_HEADER": "X-Team", "ROOFLIGHT_TENANT_TOP": "4",
           "ROOFLIGHT_PROXY_BUCKETS": "ttft=0.1,1;e2e=1,10"}
    proxy = for_agent(agent_config("--engine-url", "http://127.0.0.1:8000", environ=env))
    assert proxy is not None and proxy.listen == "127.0.0.1:8100"
    assert [s.name for s in proxy.slos] == ["ttft=0.5,tpot=0.05", "ttft=2,tpot=0.1"]
    assert proxy.tenant_header == "X-Team" and proxy.tenant_top == 4
    assert proxy.buckets["ttft"] == (0.1, 1.0) and proxy.buckets["e2e"] == (1.0, 10.0)
    path = tmp_path / "rooflight.yaml"
    path.write_text("engine_url: http://127.0.0.1:8000\nproxy_listen: 127.0.0.1:8100\n"
                    "proxy_upstream: http://127.0.0.1:8001\nslo:\n  - {ttft: 0.5, tpot: 50ms}\n  - e2e=30\n"
                    "tenant_top: 0\n")
    proxy = for_agent(agent_config("--config", str(path)))
    assert proxy is not None and proxy.upstream == "http://127.0.0.1:8001" and proxy.target == "127.0.0.1:8001"
    assert [s.name for s in proxy.slos] == ["ttft=0.5,tpot=0.05", "e2e=30"] and proxy.tenant_top == 0
    # Flags win: the flag's --slo list replaces the file's.
    proxy = for_agent(agent_config("--config", str(path), "--slo", "ttft=1"))
    assert proxy is not None and [s.name for s in proxy.slos] == ["ttft=1"]


@pytest.mark.parametrize(("argv", "says"), [
    (["--slo", "ttft=1"], "slo set without proxy_listen"),
    (["--tenant-header", "X-Tenant"], "tenant_header set without proxy_listen"),
    (["--proxy-upstream", "http://127.0.0.1:8000"], "proxy_upstream set without proxy_listen"),
    (["--proxy-listen", "nowhere"], "proxy_listen 'nowhere': write HOST:PORT"),
    (["--proxy-listen", "127.0.0.1:9746"], "share port 9746"),
    (["--proxy-listen", "0.0.0.0:9999", "--listen", "127.0.0.1:9999"], "share port 9999"),
    (["--proxy-listen", ":8100", "--engine-url", "http://127.0.0.1:8001"], "--proxy-upstream URL"),
    (["--proxy-listen", ":8100", "--proxy-upstream", "127.0.0.1:8000"], "--proxy-upstream '127.0.0.1:8000': write http://"),
    (["--proxy-listen", ":8100", "--proxy-upstream", "http://u:pw@127.0.0.1:8000"], "--proxy-upstream has a user:password"),
    (["--proxy-listen", ":8100", "--slo", "p99=1"], "keys ttft, tpot, e2e"),
    (["--proxy-listen", ":8100", "--slo", "ttft=1", "--slo", "ttft=1s"], "twice"),
    (["--proxy-listen", ":8100", "--tenant-header", "bad name"], "header name"),
    (["--proxy-listen", ":8100", "--tenant-top", "lots"], "tenant_top: 'lots' is not a whole number"),
    (["--proxy-listen", ":8100", "--tenant-top", "5000"], "between 0 and 1000"),
    (["--proxy-listen", ":8100", "--proxy-buckets", "foo=1"], "--proxy-buckets 'foo=1': write NAME=EDGE"),
])
def test_bad_proxy_settings_say_what_to_fix(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        for_agent(agent_config("--engine-url", "http://127.0.0.1:8000", *argv))


def test_a_bad_proxy_setting_exits_2_and_check_only_names_the_proxy() -> None:
    import subprocess

    exe = rooflight_exe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    bad = subprocess.run([exe, "run", "--engine-url", "http://127.0.0.1:8000", "--proxy-listen", ":8100",
                          "--slo", "ttft"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "KEY=SECONDS" in bad.stderr and "Traceback" not in bad.stderr
    good = subprocess.run([exe, "run", "--engine-url", "http://127.0.0.1:8000", "--target-name", "pod-a",
                           "--proxy-listen", "127.0.0.1:8100", "--slo", "ttft=0.5,tpot=0.05", "--check-only"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert good.returncode == 0, good.stderr
    assert "proxy 127.0.0.1:8100 -> http://127.0.0.1:8000 (target pod-a), SLOs: ttft=0.5,tpot=0.05" in good.stdout


def test_run_help_documents_the_proxy_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--help"])
    out = capsys.readouterr().out
    for words in ("--proxy-listen", "--proxy-upstream", "--slo", "--tenant-header", "--proxy-buckets",
                  "rooflight_client_", "ROOFLIGHT_PROXY_LISTEN", "ROOFLIGHT_SLO", "docs/proxy.md"):
        assert words in out, words


@pytest.mark.parametrize("engine_url, upstream, fronted", [
    ("http://vllm", "http://vllm:80", True),  # the scheme's default port, written or not
    ("https://vllm:443/v1", "https://VLLM", True),
    ("http://localhost:8000", "http://127.0.0.1:8000", False),  # names are compared, not resolved
    ("http://vllm:8000", "http://vllm:8001", False),
])
def test_the_proxy_fronts_the_target_on_the_same_host_and_port(engine_url: str, upstream: str, fronted: bool) -> None:
    config = agent_config("--engine-url", engine_url, "--proxy-listen", "127.0.0.1:0", "--proxy-upstream", upstream)
    proxy = for_agent(config)
    assert proxy is not None and (proxy.name == config.targets[0].name) is fronted


async def test_a_proxy_that_fronts_no_target_says_so_at_start(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    port, proxy_port = free_port(), free_port()
    config = agent_config("--engine-url", engine.url, "--listen", f"127.0.0.1:{port}", "--no-nvml", "--no-process",
                          "--proxy-listen", f"127.0.0.1:{proxy_port}", "--proxy-upstream", "http://127.0.0.1:9")
    with caplog.at_level("WARNING", logger="rooflight"):
        async with serve_task(Agent(config), port, proxy=for_agent(config)):
            async with aiohttp.ClientSession() as session:
                await _wait_for(session, f"{agent_url(port)}/-/healthy", "OK")
    assert any("is none of the targets' host:port" in r.getMessage() and "target='127.0.0.1:9'" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
