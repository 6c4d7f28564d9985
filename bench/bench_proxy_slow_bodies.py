"""Requests whose body never comes, against `rooflight proxy` with its default limits.

`--connections` connections from two addresses (127.0.0.2, 127.0.0.3) each send request headers that
announce a body and then send none (`Content-Length: 10`), or one byte of 100 MB (a streamed body, which
also opens an upstream connection). Printed: when the proxy had closed them all (`--read-body-timeout`,
10 s by default), whether an honest request from 127.0.0.4 is answered afterwards, the refusal counter and
the proxy's log lines. Nothing is asserted.

Run from the repository root (the `rooflight` console script installed):
    python bench/bench_proxy_slow_bodies.py [--connections 2048] [--port 32100]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time

from aiohttp import web

STREAMED = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nx"
NONE = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"


async def until_closed(reader: asyncio.StreamReader, t0: float) -> float:
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return time.monotonic() - t0


async def main(args: argparse.Namespace) -> int:
    proxy, upstream, metrics = args.port, args.port + 1, args.port + 2
    app = web.Application()

    async def echo(request: web.Request) -> web.Response:
        try:
            await request.read()
        except ConnectionError:  # the proxy cut a streamed body off: what the bench wants
            pass
        return web.Response(text="ok")

    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", upstream).start()
    with tempfile.TemporaryFile() as log:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rooflight", "proxy", "--upstream", f"http://127.0.0.1:{upstream}",
            "--listen", f"127.0.0.1:{proxy}",
            "--metrics-listen", f"127.0.0.1:{metrics}", "--log-level", "warning", stderr=log)
        try:
            await asyncio.sleep(2.5)
            conns = []
            for i in range(args.connections):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", proxy, local_addr=("127.0.0.2" if i % 2 else "127.0.0.3", 0))
                writer.write(STREAMED if i % 3 == 0 else NONE)
                conns.append((reader, writer))
            t0 = time.monotonic()
            took = await asyncio.wait_for(asyncio.gather(*(until_closed(r, t0) for r, _ in conns)), 120)
            print(f"{len(conns)} bodies that never come, from 2 addresses: closed between {min(took):.1f} and"
                  f" {max(took):.1f} s after the last was opened")
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy, local_addr=("127.0.0.4", 0))
            writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            print("an honest request then:", (await reader.read())[:15].decode())
            await asyncio.sleep(2.0)  # the exports are a snapshot refreshed every second
            reader, writer = await asyncio.open_connection("127.0.0.1", metrics)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            page = (await reader.read()).decode()
            print("\n".join(line for line in page.splitlines() if "connections_refused_total{" in line))
        finally:
            child.terminate()
            await child.wait()
            await runner.cleanup()
        log.seek(0)
        lines = log.read().decode(errors="replace").splitlines()
        print(f"the proxy's log: {len(lines)} line(s)", *lines[:3], sep="\n  ")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=2048)
    ap.add_argument("--port", type=int, default=32100, help="the proxy's port; the upstream and metrics take the next two")
    raise SystemExit(asyncio.run(main(ap.parse_args())))
