"""The agent's server against hostile and slow clients, over real sockets.

Header tricklers from one address that re-open whatever is closed must not keep another address's
scrapes out; clients that ask for /metrics and never read hold a chunk each, not the page, and are
closed at the send deadline; /api/v1/status is bounded in size and built off the event loop.
Loopback has all of 127.0.0.0/8: the hostile clients connect from 127.0.0.2.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import AsyncIterator

import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.metrics import http as metrics_http
from rooflight.agent.serve import server
from support import free_port, serve_task


def _agent() -> Agent:
    return Agent(build({}, {}, {"engine_url": ["http://127.0.0.1:9"], "nvml": False, "process": False,
                                "interval": "1", "windows": "10s", "scrape_timeout": "0.3"}))


@contextlib.asynccontextmanager
async def _serving(**limits: float) -> AsyncIterator[int]:
    port = free_port()
    async with serve_task(_agent(), port, limits=server.ServerLimits(**limits)):
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield port


async def _open_from(address: str, port: int, *, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((address, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def _trickler(port: int, stop: asyncio.Event, opened: list[int]) -> None:
    """Open from 127.0.0.2, send a header line every 0.5 s, never finish; re-open at once when closed."""
    while not stop.is_set():
        try:
            reader, writer = await _open_from("127.0.0.2", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        opened.append(1)
        try:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set() and not reader.at_eof():
                await writer.drain()
                with contextlib.suppress(asyncio.TimeoutError):
                    if await asyncio.wait_for(reader.read(1024), 0.5) == b"":
                        break
                writer.write(b"X-Slow: y\r\n")
        except OSError:
            pass
        finally:
            writer.close()


async def _scrape_from(address: str, port: int) -> int:
    try:
        reader, writer = await _open_from(address, port)
    except OSError:
        return 0
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 10)
        return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/") else 0
    except (OSError, asyncio.TimeoutError):
        return 0
    finally:
        writer.close()


# -- 12. a share of the connection cap per client ----------------------------------------------------------
async def test_reopening_tricklers_from_one_address_leave_room_for_another() -> None:
    async with _serving(max_connections=32, read_header_timeout=5) as port:
        stop, opened = asyncio.Event(), []
        tricklers = [asyncio.create_task(_trickler(port, stop, opened)) for _ in range(96)]  # 3x the cap
        try:
            await asyncio.sleep(2.0)  # the cap is full of tricklers, and more keep knocking
            statuses = []
            for _ in range(20):
                statuses.append(await _scrape_from("127.0.0.1", port))
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.gather(*tricklers, return_exceptions=True)
        assert len(opened) > 32, "the tricklers never filled the cap"
        assert statuses.count(200) >= 16, statuses  # Prometheus gets through (before: most were 503)


async def test_one_address_alone_is_still_capped() -> None:
    """With one address only, nobody holds more than the newcomer would: the cap refuses as before."""
    async with _serving(max_connections=4, read_header_timeout=5) as port:
        held = [await _open_from("127.0.0.2", port) for _ in range(4)]
        await asyncio.sleep(0.1)
        try:
            assert await _scrape_from("127.0.0.2", port) == 503
            reader, writer = await _open_from("127.0.0.2", port)
            refused = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert b"X-Content-Type-Options: nosniff" in refused and b"X-Frame-Options: DENY" in refused
            assert await _scrape_from("127.0.0.1", port) == 200  # another address takes one of the idle four
        finally:
            for _, writer in held:
                writer.close()


# -- 15. clients that ask for /metrics and never read ------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


PAGE = b"# a big page\n" + b"rooflight_filler_total{i=\"%d\"} 1\n" * 1 + b"".join(
    b"rooflight_filler_total{i=\"%08d\"} 1\n" % i for i in range(240_000))  # ~8 MiB


async def test_clients_that_never_read_hold_a_chunk_each_not_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "render_metrics", lambda registry, accept, names: (PAGE, "text/plain; version=0.0.4"))
    async with _serving(max_connections=64) as port:
        clients = []
        await _scrape_from("127.0.0.1", port)  # the page once, so it is counted in the baseline
        before = _rss()
        for _ in range(16):
            reader, writer = await _open_from("127.0.0.2", port, rcvbuf=4096)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append((reader, writer))
        await asyncio.sleep(3.0)
        grown = _rss() - before
        for _, writer in clients:
            writer.close()
        # before: each held what the kernel would not take, ~5 MiB of the 8 MiB page: ~80 MiB in all
        assert grown < 24 * 2**20, f"{grown / 2**20:.1f} MiB for 16 clients that never read"


async def test_a_client_that_never_reads_is_closed_at_the_send_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http, "render_metrics", lambda registry, accept, names: (PAGE, "text/plain; version=0.0.4"))
    monkeypatch.setattr(metrics_http, "SEND_SECONDS", 1.0)
    async with _serving() as port:
        reader, writer = await _open_from("127.0.0.2", port, rcvbuf=4096)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(3.0)  # past the deadline without reading a byte
        got = 0
        start = time.monotonic()
        try:
            while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
                got += len(chunk)
        except (ConnectionResetError, asyncio.IncompleteReadError):
            pass
        writer.close()
        assert got < len(PAGE) / 2, got  # closed midway, not held open until it read everything
        assert time.monotonic() - start < 10
        assert await _scrape_from("127.0.0.1", port) == 200  # a reading client still gets the page


# -- 11. /api/v1/status: bounded, built once per snapshot, off the event loop -----------------------------
def many_models_page(models: int) -> str:
    """The recorded vLLM page with each of its model's series repeated for `models` model names."""
    from support import ROOT

    out = []
    for line in (ROOT / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom").read_text().splitlines():
        if 'model_name="tiny-llama"' in line and not line.startswith("#"):
            out += [line.replace('model_name="tiny-llama"', f'model_name="m{i:03d}"') for i in range(models)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


async def test_status_history_shares_a_total_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiohttp

    from rooflight.agent.metrics import history
    from support import FakeEngine

    monkeypatch.setattr(history, "HISTORY_TOTAL_POINTS", 64)
    engine = FakeEngine(body=many_models_page(16))
    await engine.start()
    config = build({}, {}, {"engine_url": [engine.url], "nvml": False, "process": False, "interval": "0.1",
                            "windows": "10s", "scrape_timeout": "2"})
    try:
        port = free_port()
        async with serve_task(Agent(config), port), aiohttp.ClientSession() as s:
            await asyncio.sleep(0.5)
            for _ in range(40):  # a poll every 0.15 s while the agent samples every 0.1 s
                async with s.get(f"http://127.0.0.1:{port}/api/v1/status") as r:
                    body = await r.json()
                await asyncio.sleep(0.15)
        series = [x for t in body["targets"] for x in t["series"]]
        points = sum(len(x["history"]["t"]) for x in series)
        assert len(series) >= 16  # 16 models, a series per model and engine
        assert points <= len(series) * 8, points  # 64 shared, MIN_POINTS (8) at least each; before: ~40 each
        assert all(len(x["history"]["t"]) >= 2 for x in series)
    finally:
        await engine.stop()


async def test_pollers_share_one_status_build_made_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import aiohttp

    from rooflight.agent.serve import page

    builds: list[str] = []
    real = page.status_dict

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        builds.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(page, "status_dict", spy)
    async with _serving() as port, aiohttp.ClientSession() as s:
        async def poll() -> None:
            for _ in range(20):
                async with s.get(f"http://127.0.0.1:{port}/api/v1/status") as r:
                    assert r.status == 200
                    await r.read()

        await asyncio.gather(*(poll() for _ in range(10)))
    # the agent's snapshot changes at most once a second (1 s interval, failing engine): 200 polls, a few builds
    assert 1 <= len(builds) <= 20, len(builds)
    assert threading.main_thread().name not in builds, builds


async def test_head_and_every_encoding_of_metrics_answer_well() -> None:
    """/metrics is sent by hand now (a chunk at a time): HEAD gets no body, gzip only when asked."""
    import gzip

    import aiohttp

    async with _serving() as port, aiohttp.ClientSession(auto_decompress=False) as s:
        url = f"http://127.0.0.1:{port}/metrics"
        async with s.head(url, headers={"Accept-Encoding": "gzip"}) as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) > 0
            assert await r.read() == b""
        async with s.get(url, headers={"Accept-Encoding": "gzip"}) as r:  # the same connection, still in step
            assert r.headers["Content-Encoding"] == "gzip"
            assert b"rooflight_build_info" in gzip.decompress(await r.read())
        for encoding in ("identity", "gzip;q=0", ""):
            async with s.get(url, headers={"Accept-Encoding": encoding}) as r:
                assert "Content-Encoding" not in r.headers, encoding
                assert b"rooflight_build_info" in await r.read()
        async with s.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                       "Accept-Encoding": "identity"}) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await r.read()).rstrip().endswith(b"# EOF")
