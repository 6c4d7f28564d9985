"""The proxy's port against hostile peers: what they hold, what they cost, what honest clients see.

`rooflight proxy` (the real command, default limits) in a child process, in front of an upstream in this
process; this process plays the attackers, on 127.0.0.1:

1. `--tricklers` connections that send request headers a byte a second and never finish them, and
   `--idle` connections that send nothing: how many the proxy admitted (one client may hold half of the
   4,096 connections), how long until it closed them all, and an honest request from another address
   (127.0.0.2) meanwhile.
2. `--bad` malformed requests (escape sequences in the method, a header without a colon, an
   absolute-form target): the log lines the proxy wrote for them, and whether any held a client byte.
3. `--answers` concurrent non-streamed JSON answers of 8 MiB, then as many SSE events of 4 MiB that are
   held unfinished: the proxy's peak RSS over its idle RSS, and the answers its accounting skipped
   (`rooflight_client_accounting_over_budget_total`).

Timing and memory are printed, never asserted. Needs an open-file limit above the sockets asked for.

Run from the repository root (the `rooflight` console script installed):
    python bench/bench_proxy_hostile.py [--tricklers 1000] [--idle 3000] [--bad 2000] [--answers 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time

import aiohttp
import psutil
from aiohttp import web

MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstream:
    """Answers /echo at once; /v1/completions with an 8 MiB JSON answer or a 4 MiB SSE event, each held
    unfinished until `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.json_body = json.dumps({"choices": [{"message": {"content": "x" * (8 * MiB - 200)},
                                                  "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 2}}).encode()
        self.event = b'data: {"choices":[{"delta":{"content":"' + b"x" * (4 * MiB - 100)

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_route("*", "/echo", self.echo)
        app.router.add_post("/v1/completions", self.answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"

    async def echo(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def answer(self, request: web.Request) -> web.StreamResponse:
        stream = (await request.json()).get("stream", False)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream" if stream else "application/json"})
        if not stream:
            response.content_length = len(self.json_body)
        await response.prepare(request)
        await response.write(self.event if stream else self.json_body[:-1])
        await self.release.wait()
        await response.write(b'"}}]}\n\ndata: [DONE]\n\n' if stream else self.json_body[-1:])
        await response.write_eof()
        return response


async def raw(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def until_closed(reader: asyncio.StreamReader, limit: float) -> float | None:
    start = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
    except (asyncio.TimeoutError, ConnectionError):
        return None if time.monotonic() - start >= limit else time.monotonic() - start
    return time.monotonic() - start


async def holders(port: int, tricklers: int, idle: int) -> dict[str, object]:
    stop = asyncio.Event()
    conns = []
    for i in range(tricklers + idle):
        try:
            conns.append(await raw(port))
        except OSError:
            break

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            writer.write(b"X")
            await asyncio.sleep(1.0)

    tasks = [asyncio.create_task(trickle(w)) for _, w in conns[:tricklers]]
    started = time.monotonic()
    closing = [asyncio.create_task(until_closed(r, 60)) for r, _ in conns]
    await asyncio.sleep(1.0)
    honest = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), force_close=True)) as s:
        for _ in range(10):
            t = time.monotonic()
            async with s.get(f"http://127.0.0.1:{port}/echo") as r:
                await r.read()
                honest.append((r.status, time.monotonic() - t))
    closed = await asyncio.gather(*closing)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for _, w in conns:
        w.close()
    times = sorted(t for t in closed if t is not None)
    # A refused connection is answered 503 and closed at once; an admitted one at the header timeout.
    admitted = [t for t in times if t > 0.5]
    return {"opened": len(conns), "refused_at_once": len(times) - len(admitted), "admitted": len(admitted),
            "all_closed_after_s": round(time.monotonic() - started, 1) if len(times) == len(conns) else None,
            "admitted_closed_at_s": [round(admitted[0], 1), round(admitted[-1], 1)] if admitted else None,
            "honest_statuses": sorted({s for s, _ in honest}), "honest_max_ms": round(max(d for _, d in honest) * 1e3, 1)}


async def bad_requests(port: int, count: int) -> float:
    kinds = [b"\x1b[31mEVIL\x1b[0m / HTTP/1.1\r\nHost: x\r\n\r\n",
             b"GET / HTTP/1.1\r\nHost: x\r\nEVIL\x1b]0;owned\x07 no colon\r\n\r\n",
             b"GET http://EVIL.example/\x1b[2J HTTP/1.1\r\nHost: x\r\n\r\n"]
    start = time.monotonic()
    for i in range(0, count, 100):
        async def one(request: bytes) -> None:
            reader, writer = await raw(port)
            writer.write(request)
            await reader.read()
            writer.close()
        await asyncio.gather(*(one(kinds[(i + j) % 3]) for j in range(min(100, count - i))))
    return time.monotonic() - start


async def memory(port: int, metrics_port: int, upstream: Upstream, proc: psutil.Process, answers: int,
                 stream: bool) -> dict[str, float]:
    upstream.release.clear()
    base = proc.memory_info().rss
    peak = base
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def ask() -> int:
            async with s.post(f"http://127.0.0.1:{port}/v1/completions", json={"stream": stream}) as r:
                return len(await r.read())
        tasks = [asyncio.create_task(ask()) for _ in range(answers)]
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            peak = max(peak, proc.memory_info().rss)
            await asyncio.sleep(0.05)
        upstream.release.set()
        sizes = await asyncio.gather(*tasks)
        await asyncio.sleep(1.5)  # the proxy refreshes its exports every second
        async with s.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            text = await r.text()
    skipped = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("rooflight_client_accounting_over_budget_total"))
    return {"rss_idle_mb": base / 1e6, "rss_peak_mb": peak / 1e6, "answers_relayed_whole": sum(1 for x in sizes if x > 4 * MiB - 200),
            "answers_skipped": skipped}


async def proxy_child(url: str) -> tuple[asyncio.subprocess.Process, int, int]:
    """A fresh `rooflight proxy` (each phase gets its own, so one phase's memory does not hide the next's)."""
    port, metrics_port = free_port(), free_port()
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "rooflight", "proxy", "--upstream", url,
                                                 "--listen", f"127.0.0.1:{port}",
                                                 "--metrics-listen", f"127.0.0.1:{metrics_port}", "--log-level", "info",
                                                 stderr=asyncio.subprocess.PIPE)
    await asyncio.sleep(2.0)
    return child, port, metrics_port


async def stop(child: asyncio.subprocess.Process) -> list[str]:
    child.terminate()
    _, err = await child.communicate()
    return err.decode(errors="replace").splitlines()


async def main(args: argparse.Namespace) -> int:
    upstream = Upstream()
    runner, url = await upstream.start()
    out: dict[str, object] = {}
    try:
        child, port, _ = await proxy_child(url)
        try:
            out["holders"] = await holders(port, args.tricklers, args.idle)
            out["bad_requests_s"] = round(await bad_requests(port, args.bad), 2)
        finally:
            lines = await stop(child)
        out["proxy_log_lines"] = len(lines)
        out["log_lines_with_client_bytes"] = sum(1 for line in lines if "EVIL" in line or "\x1b" in line or "\\x1b" in line)
        for name, stream in (("json_8mib", False), ("sse_4mib_unfinished", True)):
            child, port, metrics_port = await proxy_child(url)
            try:
                out[name] = await memory(port, metrics_port, upstream, psutil.Process(child.pid), args.answers, stream)
            finally:
                await stop(child)
    finally:
        await runner.cleanup()
    print(f"bench_proxy_hostile: {psutil.cpu_count()} CPUs, load avg {', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tricklers", type=int, default=1000)
    ap.add_argument("--idle", type=int, default=3000)
    ap.add_argument("--bad", type=int, default=2000)
    ap.add_argument("--answers", type=int, default=60)
    sys.exit(asyncio.run(main(ap.parse_args())))
