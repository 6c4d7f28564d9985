"""The proxy's memory under streams that never end: a hostile (or stuck) upstream sending endless tiny SSE
events. Each stream kept every gap between tokens (8 bytes a token, forever); now each keeps a bounded
record (agent/proxy/tracker.py, TokenGaps).

`rooflight proxy` (the real command) in a child process, `--streams` chat streams through it from this
process, each answered by an upstream here with one small event per `--gap` seconds for `--seconds`. The
child's RSS is printed every 5 s; nothing is asserted.

Run from the repository root (the `rooflight` console script installed):
    python bench/bench_proxy_endless.py [--streams 10] [--seconds 40] [--gap 0]
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

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def endless(request: web.Request) -> web.StreamResponse:
    gap = request.app["gap"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        while True:
            await response.write(EVENT)
            await asyncio.sleep(gap)
    except ConnectionError:  # the proxy went away (the end of the run)
        return response


async def main(args: argparse.Namespace) -> int:
    app = web.Application()
    app["gap"] = args.gap
    app.router.add_post("/v1/chat/completions", endless)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    up = free_port()
    await web.TCPSite(runner, "127.0.0.1", up).start()
    port, metrics_port = free_port(), free_port()
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", "rooflight", "proxy", "--upstream",
                                                 f"http://127.0.0.1:{up}", "--listen",
                                                 f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                                                 "--log-level", "warning")
    proc = psutil.Process(child.pid)
    tokens = [0] * args.streams
    try:
        await asyncio.sleep(2.0)
        print(f"idle RSS {proc.memory_info().rss / 2**20:.1f} MiB")

        async def read(i: int, session: aiohttp.ClientSession) -> None:
            body = json.dumps({"model": "m", "stream": True, "messages": []})
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=body) as r:
                async for piece in r.content.iter_any():
                    tokens[i] += piece.count(b"data:")

        async with aiohttp.ClientSession() as session:
            readers = [asyncio.create_task(read(i, session)) for i in range(args.streams)]
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < args.seconds:
                await asyncio.sleep(5.0)
                print(f"t={elapsed + 5:4.0f} s  RSS {proc.memory_info().rss / 2**20:6.1f} MiB  tokens {sum(tokens):,}")
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    finally:
        child.terminate()
        await child.wait()
        await runner.cleanup()
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between events (0: as fast as it goes)")
    raise SystemExit(asyncio.run(main(ap.parse_args())))
