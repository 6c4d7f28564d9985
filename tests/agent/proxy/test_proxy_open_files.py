"""The proxy within the process's open-file limit: under `ulimit -n 1024`,
1,000 slow bodies from one address made asyncio log 103,197 "socket.accept() out of system resource"
tracebacks in 3 s from the proxy's loop, and the agent's /metrics stopped answering. Over real sockets, with
`rooflight run --proxy-listen` in a child whose RLIMIT_NOFILE is set low."""

from __future__ import annotations

import asyncio
import os
import resource

import aiohttp
import pytest

from rooflight.agent.proxy.limits import FD_RESERVE, fit_to_open_files
from demo_procs import wait_healthy
from support import free_port, rooflight_exe
from test_run_proxy import Engine, engine  # noqa: F401 (the fixture)

LIMIT = 512  # the child's open files: (512 - FD_RESERVE) // 2 = 128 proxy connections fit
FLOOD = 600  # slow bodies from one address, well past what the limit holds


def test_the_connection_cap_fits_the_open_file_limit() -> None:
    assert fit_to_open_files(4096, 2048, -1) == (4096, 2048)  # unlimited
    assert fit_to_open_files(100, 50, 100_000) == (100, 50)  # fits already
    cap, share = fit_to_open_files(4096, 2048, 1024)
    assert cap == (1024 - FD_RESERVE) // 2 and share == cap // 2
    assert 2 * cap + FD_RESERVE <= 1024
    assert fit_to_open_files(4096, 2048, 10) == (1, 1)


def _low_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


async def _slow_body(port: int) -> asyncio.StreamWriter | None:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
    return writer


async def test_a_flood_past_the_open_file_limit_is_bounded_quiet_and_metrics_answer(engine: Engine) -> None:
    port, proxy_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    proc = await asyncio.create_subprocess_exec(
        rooflight_exe(), "run", "--engine-url", engine.url, "--listen", f"127.0.0.1:{port}",
        "--proxy-listen", f"127.0.0.1:{proxy_port}", "--no-nvml", "--no-process", "--interval", "0.5",
        "--log-level", "warning", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=_low_open_files)
    try:
        out, err = await _flood(proc, port, proxy_port)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = (out + err).decode(errors="replace").splitlines()
    assert len(lines) < 50, lines[:20]  # one line for the lowered cap, a few refusal lines: not thousands
    assert any("open-file limit" in line and "at most 128 connections" in line for line in lines), lines[:20]
    assert not any("Traceback" in line for line in lines), lines[:20]


async def _flood(proc: asyncio.subprocess.Process, port: int, proxy_port: int) -> tuple[bytes, bytes]:
    """FLOOD slow bodies held 3 s while the agent's /metrics is read; the child's output once it stopped."""
    async with aiohttp.ClientSession() as session:
        metrics = f"http://127.0.0.1:{port}/metrics"
        await wait_healthy(session, metrics)  # where a copy of it went on after 40 s as if the agent were up
        writers = [await _slow_body(proxy_port) for _ in range(FLOOD)]
        await asyncio.sleep(3.0)  # the old code logged ~100,000 tracebacks in this time
        for _ in range(3):  # the agent's own port still answers, during the flood
            async with session.get(metrics, timeout=aiohttp.ClientTimeout(total=10)) as r:
                assert r.status == 200 and "rooflight_client_" in await r.text()
        for w in writers:
            if w is not None:
                w.close()
    proc.terminate()
    return await asyncio.wait_for(proc.communicate(), 30)


async def test_accept_failures_on_the_proxys_loop_are_one_line_not_a_traceback_each(
        caplog: object, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from rooflight.agent.proxy import limits

    monkeypatch.setattr(limits, "ACCEPT_FAILURES", limits.RefusalLog("proxy: cannot accept", logger=limits.log))  # none logged yet
    loop = asyncio.get_running_loop()
    undo = limits.quiet_accept_errors(loop)
    try:
        with caplog.at_level(logging.DEBUG):  # type: ignore[attr-defined]
            for _ in range(1000):  # what asyncio reports on each failed accept when the open files run out
                loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                             "exception": OSError(24, "Too many open files")})
        records = caplog.records  # type: ignore[attr-defined]
        assert 1 <= len(records) <= 2 and "Too many open files" in records[0].getMessage()
        assert not any(r.exc_info for r in records)
    finally:
        undo()
