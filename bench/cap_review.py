"""The connection cap and /metrics under attack, against the real `rooflight run`.

Each part starts `rooflight run` in its own process on 127.0.0.1 (default --max-connections 256) and attacks
it from 127.0.0.2/127.0.0.3 (loopback has all of 127.0.0.0/8):

- flood: LOOPS keep-alive loops from 127.0.0.2 send a wrong password back to back (a web config with a
  cost-4 user): past the burst each answer is a 429 after 1 s. Meanwhile a NEW connection from 127.0.0.1
  with the right password every second: how many get 200, how many 503.
- nat: a scraper keeps one connection alive from 127.0.0.2; TRICKLERS header tricklers from 127.0.0.2 (the
  same NAT) and as many from 127.0.0.3 re-open whatever is closed; the scraper asks every second on its
  session: how many 200.
- resets: RESETS GET /metrics, each followed at once by a TCP reset: the agent's log lines, bytes and
  tracebacks.

    python bench/cap_review.py --parts flood,nat,resets
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt

ROOT = Path(__file__).resolve().parents[1]
PASSWORD = "correct horse battery staple"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _agent(extra: list[str], log: Path) -> Any:
    port = _free_port()
    args = [sys.executable, "-m", "rooflight", "run", "--engine-url", "http://127.0.0.1:9", "--no-nvml",
            "--no-process", "--listen", f"127.0.0.1:{port}", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            for _ in range(200):
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                    break
                time.sleep(0.05)
            yield port
        finally:
            proc.terminate()
            proc.wait(10)


def _basic(password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"prometheus:{password}".encode()).decode()}


async def _open_from(address: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    sock.bind((address, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def _get_once(address: str, port: int, headers: dict[str, str]) -> int:
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


async def flood(loops: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        web = Path(tmp) / "web.yml"
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        with _agent(["--web-config", str(web)], Path(tmp) / "log") as port:
            stop, limited = asyncio.Event(), [0]
            connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=loops)
            async with aiohttp.ClientSession(connector=connector) as session:
                async def one(i: int) -> None:
                    while not stop.is_set():
                        try:
                            async with session.get(f"http://127.0.0.1:{port}/metrics",
                                                   headers=_basic(f"guess{i}")) as r:
                                limited[0] += r.status == 429
                                await r.read()
                        except aiohttp.ClientError:
                            await asyncio.sleep(0.05)

                tasks = [asyncio.create_task(one(i)) for i in range(loops)]
                await asyncio.sleep(4.0)
                honest, start = [], time.monotonic()
                while time.monotonic() - start < seconds:
                    honest.append(await _get_once("127.0.0.1", port, _basic(PASSWORD)))
                    await asyncio.sleep(1.0)
                stop.set()
                await asyncio.gather(*tasks)
    return {"loops": loops, "honest_200": honest.count(200), "honest_503": honest.count(503),
            "honest_other": len(honest) - honest.count(200) - honest.count(503), "flood_429": limited[0]}


async def _trickler(address: str, port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await _open_from(address, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
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


async def nat(tricklers: int, scrapes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, _agent([], Path(tmp) / "log") as port:
        url = f"http://127.0.0.1:{port}/metrics"
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=1)
        stop, statuses = asyncio.Event(), []
        async with aiohttp.ClientSession(connector=connector) as scraper:
            async with scraper.get(url) as r:
                await r.read()
            tasks = [asyncio.create_task(_trickler("127.0.0.2", port, stop)) for _ in range(tricklers)]
            await asyncio.sleep(2.0)
            tasks += [asyncio.create_task(_trickler("127.0.0.3", port, stop)) for _ in range(tricklers)]
            await asyncio.sleep(2.0)
            for _ in range(scrapes):
                try:
                    async with scraper.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                        statuses.append(r.status)
                        await r.read()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    statuses.append(0)
                await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*tasks)
    return {"tricklers_per_address": tricklers, "scrapes": scrapes, "scrapes_200": statuses.count(200)}


async def _ask_and_reset(port: int) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    except OSError:
        pass
    finally:
        sock.close()


async def resets(count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        with _agent([], log) as port:
            before = log.stat().st_size
            for _ in range(count // 20):
                await asyncio.gather(*(_ask_and_reset(port) for _ in range(20)))
                await asyncio.sleep(0.01)
            await asyncio.sleep(2.0)
            text = log.read_bytes()[before:]
    return {"resets": count, "log_bytes": len(text), "log_lines": text.count(b"\n"),
            "tracebacks": text.count(b"Traceback")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="flood,nat,resets")
    p.add_argument("--loops", type=int, default=300)
    p.add_argument("--seconds", type=float, default=27.0)
    p.add_argument("--tricklers", type=int, default=300)
    p.add_argument("--scrapes", type=int, default=24)
    p.add_argument("--resets", type=int, default=2000)
    a = p.parse_args()
    for part in a.parts.split(","):
        if part == "flood":
            print("flood", asyncio.run(flood(a.loops, a.seconds)), flush=True)
        elif part == "nat":
            print("nat", asyncio.run(nat(a.tricklers, a.scrapes)), flush=True)
        elif part == "resets":
            print("resets", asyncio.run(resets(a.resets)), flush=True)


if __name__ == "__main__":
    main()
