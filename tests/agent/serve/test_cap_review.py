"""The connection cap and /metrics under attack, over real sockets.

A client answered 429 waits LIMITED_DELAY for it; that wait must not hold a place at the cap against
another address's login. Eviction at the cap must spare the address's long-lived keep-alive (Prometheus
behind the same NAT as the attacker) and take its newest connection. A client that resets its connection
right after asking for /metrics is no traceback in the log. Loopback has all of 127.0.0.0/8: the hostile
clients connect from 127.0.0.2 and 127.0.0.3.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import struct
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import bcrypt
import pytest

from rooflight.agent.config.agent import build
from rooflight.agent.sampling.sampler import Agent
from rooflight.agent.serve import server, webconfig
from support import free_port, serve_task

PASSWORD = "correct horse battery staple"


def _agent() -> Agent:
    return Agent(build({}, {}, {"engine_url": ["http://127.0.0.1:9"], "nvml": False, "process": False,
                                "interval": "1", "windows": "10s", "scrape_timeout": "0.3"}))


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@contextlib.asynccontextmanager
async def _serving(security: Any = None, **limits: float) -> AsyncIterator[int]:
    port = free_port()
    async with serve_task(_agent(), port, security=security, limits=server.ServerLimits(**limits)):
        for _ in range(200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield port


async def _open_from(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def _get_once(address: str, port: int, headers: dict[str, str]) -> int:
    """A new connection from `address`: one GET /metrics, its status (0: no answer)."""
    try:
        reader, writer = await _open_from(address, port)
    except OSError:
        return 0
    try:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 15)
        return int(raw.split(b" ", 2)[1]) if raw.startswith(b"HTTP/") else 0
    except (OSError, asyncio.TimeoutError):
        return 0
    finally:
        writer.close()


# -- a client over its share cannot hold the cap with delayed 429s -------------------------------------------
async def _wrong_password_loops(port: int, loops: int, stop: asyncio.Event, statuses: list[int]) -> None:
    """`loops` keep-alive connections from 127.0.0.2 sending a wrong password back to back until `stop`."""
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=loops)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(i: int) -> None:
            while not stop.is_set():
                try:
                    async with session.get(f"http://127.0.0.1:{port}/metrics",
                                           headers=_basic("prometheus", f"guess{i}")) as r:
                        statuses.append(r.status)
                        await r.read()
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(one(i) for i in range(loops)))


async def test_delayed_429s_from_one_address_do_not_hold_the_cap_against_another(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    async with _serving(webconfig.WebSecurity(path), max_connections=16) as port:
        stop, statuses = asyncio.Event(), []
        flood = asyncio.create_task(_wrong_password_loops(port, 48, stop, statuses))  # 3x the cap
        try:
            await asyncio.sleep(4.0)  # the burst is spent: every answer is a 429 after LIMITED_DELAY
            honest = []
            for _ in range(10):
                honest.append(await _get_once("127.0.0.1", port, _basic("prometheus", PASSWORD)))
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await flood
        assert statuses.count(429) > 16, statuses.count(429)  # the flood was limited and held the cap
        assert honest.count(200) >= 8, honest  # before: mostly 503 (the waits counted as "in a request")
        assert "Traceback" not in caplog.text  # an evicted wait ends quietly


# -- eviction keeps the address's longest-lived keep-alive ---------------------------------------------------
async def _trickler(address: str, port: int, stop: asyncio.Event, opened: list[str]) -> None:
    """Open from `address`, send a header line every 0.5 s, never finish; re-open at once when closed."""
    while not stop.is_set():
        try:
            reader, writer = await _open_from(address, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        opened.append(address)
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


async def test_an_attacker_behind_the_scrapers_address_does_not_evict_its_keep_alive() -> None:
    async with _serving(max_connections=16, read_header_timeout=5) as port:
        url = f"http://127.0.0.1:{port}/metrics"
        scraper = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=1))
        stop, opened, statuses = asyncio.Event(), [], []
        tasks: list[asyncio.Task[None]] = []
        try:
            async with scraper.get(url) as r:  # the scraper's keep-alive: the address's oldest connection
                assert r.status == 200
                await r.read()
            # tricklers on the scraper's address fill the cap; others from another address knock
            tasks += [asyncio.create_task(_trickler("127.0.0.2", port, stop, opened)) for _ in range(24)]
            await asyncio.sleep(1.0)
            tasks += [asyncio.create_task(_trickler("127.0.0.3", port, stop, opened)) for _ in range(24)]
            await asyncio.sleep(1.0)
            for _ in range(20):
                try:
                    async with scraper.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                        statuses.append(r.status)
                        await r.read()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    statuses.append(0)
                await asyncio.sleep(0.3)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await scraper.close()
        assert opened.count("127.0.0.3") >= 8, "the other address never took places"
        assert statuses.count(200) >= 16, statuses  # before: its keep-alive evicted, its reconnects refused


# -- a client gone before its /metrics answer ----------------------------------------------------------------
async def _ask_and_reset(port: int) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends a RST
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    except OSError:
        pass
    finally:
        sock.close()


async def test_clients_that_reset_after_asking_for_metrics_log_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    caplog.set_level(logging.INFO, logger="rooflight")
    gone = server.GONE.total
    async with _serving() as port:
        for _ in range(20):
            await asyncio.gather(*(_ask_and_reset(port) for _ in range(10)))
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # the last renders finish and find their clients gone
        assert await _get_once("127.0.0.1", port, {}) == 200
    text = caplog.text
    assert "Traceback" not in text and "Error handling request" not in text, text[:2000]
    aiohttp_errors = [r.getMessage() for r in caplog.records if r.name.startswith("aiohttp") and r.levelno >= logging.WARNING]
    assert aiohttp_errors == []  # before: one "Error handling request" with its traceback per aborted request
    gone_lines = [r.getMessage() for r in caplog.records if "went away" in r.getMessage()]
    assert len(gone_lines) <= 2, gone_lines  # one line a minute at most, with a count
    assert server.GONE.total > gone  # counted, not lost
