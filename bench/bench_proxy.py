"""What the proxy costs a stream: added latency per chunk and the proxy's CPU per 1,000 chunks.

Three processes: a fake OpenAI SSE upstream (each stream sends `--rate` chunks per second, every chunk
carrying the upstream's CLOCK_MONOTONIC send time in nanoseconds as its content), the proxy
(`rooflight.agent.proxy.server.ProxyServer`, with an SLO and the default windows), and this process as the
client. The client opens `--streams` concurrent streams, straight to the upstream ("direct"), through the
proxy ("proxied"), and through the proxy on a route it relays without reading ("relayed": aiohttp's own
cost), in phases of `--seconds` each (`--rounds` times), and takes each chunk's latency as its
receive time minus its send time (one clock: the same machine). Printed per path: chunks/s delivered,
latency p50/p99/max; then the proxy's added p50/p99 (proxied minus direct) and the ratio, and the proxy
process's CPU per 1,000 chunks and as a share of one core per 10,000 chunks/s, next to the upstream's own
CPU per 1,000 chunks (the yardstick: the cheapest possible server of the same chunks).

Latencies include scheduling: on a machine with fewer free cores than the three processes, a chunk also
waits for a core. Timing is printed, never asserted.

Run from the repository root:  python bench/bench_proxy.py [--streams 64] [--rate 1000] [--seconds 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the fake upstream (its own process) -----------------------------------------------------------------------


def upstream_main(port: int, rate: float) -> None:
    from aiohttp import web

    head = b'data: {"id":"b","object":"chat.completion.chunk","model":"bench","choices":[{"index":0,"delta":{"content":"'
    tail = b'"},"finish_reason":null}]}\n\n'

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seconds = float(body.get("seconds", 5.0))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = time.monotonic()
        n = 0
        try:
            while True:
                now = time.monotonic()
                if now - start >= seconds:
                    break
                due = start + n / rate
                if due > now:
                    await asyncio.sleep(due - now)
                await response.write(head + str(time.monotonic_ns()).encode() + tail)
                n += 1
            await response.write(b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
                                 b'"usage":{"prompt_tokens":1,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % n)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", stream)
        app.router.add_post("/raw/stream", stream)  # the same stream on a route the proxy only relays
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the proxy (its own process) -------------------------------------------------------------------------------


def proxy_main(upstream: str, port: int, metrics_port: int, cpu: int | None = None, profile: str = "",
               loop: str = "asyncio") -> None:
    import os
    import signal

    from rooflight.agent.proxy.config import build
    from rooflight.agent.proxy.server import ProxyServer

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    if profile:  # cProfile the whole process, written out on SIGTERM
        import cProfile

        profiler = cProfile.Profile()

        def dump(*_: object) -> None:
            profiler.disable()
            profiler.dump_stats(profile)
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
        profiler.enable()

    async def main() -> None:
        config = build(upstream, listen=f"127.0.0.1:{port}", metrics_listen=f"127.0.0.1:{metrics_port}",
                       slos=["ttft=0.5,tpot=0.05"])
        server = ProxyServer(config)
        await server.start()
        await asyncio.Event().wait()

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


# -- the client (this process) ---------------------------------------------------------------------------------


async def one_stream(session, url: str, seconds: float, latencies: list[float]) -> int:  # type: ignore[no-untyped-def]
    marker = b'"content":"'
    got = 0
    tail = b""
    async with session.post(url, json={"model": "bench", "stream": True, "seconds": seconds}) as r:
        while True:
            data = await r.content.readany()
            if not data:
                break
            now = time.monotonic_ns()
            data = tail + data
            lines = data.split(b"\n\n")
            tail = lines.pop()
            for line in lines:
                i = line.find(marker)
                if i < 0:
                    continue
                j = line.find(b'"', i + len(marker))
                if j > i + len(marker):
                    latencies.append((now - int(line[i + len(marker):j])) / 1e9)
                    got += 1
    return got


async def phase(url: str, streams: int, seconds: float) -> tuple[list[float], int, float]:
    import aiohttp

    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()
        counts = await asyncio.gather(*(one_stream(session, url, seconds, latencies) for _ in range(streams)))
        wall = time.monotonic() - start
    return latencies, sum(counts), wall


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1000.0, help="chunks per second per stream")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--rounds", type=int, default=2, help="direct/proxied phase pairs")
    ap.add_argument("--proxy-cpu", type=int, default=None, help="pin the proxy to this core (the others elsewhere)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="the proxy's event loop")
    ap.add_argument("--profile", default="", help="cProfile the proxy into this file (slows it: for where, not how much)")
    args = ap.parse_args()

    ctx = multiprocessing.get_context("spawn")
    up_port, px_port, m_port = _free_port(), _free_port(), _free_port()
    up = ctx.Process(target=upstream_main, args=(up_port, args.rate), daemon=True)
    up.start()
    px = ctx.Process(target=proxy_main, args=(f"http://127.0.0.1:{up_port}", px_port, m_port, args.proxy_cpu,
                                              args.profile, args.loop), daemon=True)
    px.start()
    time.sleep(2.0)
    up_ps, px_ps, me = psutil.Process(up.pid), psutil.Process(px.pid), psutil.Process()
    if args.proxy_cpu is not None:  # the proxy alone on its core; upstream and client on the rest
        rest = set(range(psutil.cpu_count())) - {args.proxy_cpu}
        up_ps.cpu_affinity(sorted(rest))
        me.cpu_affinity(sorted(rest))
    direct_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
    proxy_url = f"http://127.0.0.1:{px_port}/v1/chat/completions"
    relay_url = f"http://127.0.0.1:{px_port}/raw/stream"
    paths = (("direct", direct_url), ("proxied", proxy_url), ("relayed", relay_url))
    result = {name: {"lat": [], "chunks": 0, "wall": 0.0, "up_cpu": 0.0, "px_cpu": 0.0, "me_cpu": 0.0}
              for name, _ in paths}
    try:
        asyncio.run(phase(direct_url, 4, 0.5))  # warm up both paths
        asyncio.run(phase(proxy_url, 4, 0.5))
        for _ in range(args.rounds):
            for name, url in paths:
                cpu0 = (_cpu(up_ps), _cpu(px_ps), _cpu(me))
                lat, chunks, wall = asyncio.run(phase(url, args.streams, args.seconds))
                cpu1 = (_cpu(up_ps), _cpu(px_ps), _cpu(me))
                r = result[name]
                r["lat"] += lat
                r["chunks"] += chunks
                r["wall"] += wall
                for key, a, b in zip(("up_cpu", "px_cpu", "me_cpu"), cpu0, cpu1):
                    r[key] += b - a
    finally:
        for p in (px, up):
            p.terminate()
            p.join(5)

    print(f"bench_proxy: {args.streams} streams x {args.rate:g} chunks/s offered, {args.rounds} x {args.seconds:g} s "
          f"per path, {psutil.cpu_count()} CPUs, load avg {', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
    print(f"{'path':8} {'chunks/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'upstream CPU/1k':>16} {'client CPU/1k':>14}")
    for name, r in result.items():
        lat = r["lat"]
        if not lat:
            print(f"{name:8} no chunks received")
            return 1
        print(f"{name:8} {r['chunks'] / r['wall']:9.0f} {_q(lat, 50) * 1e3:8.3f} {_q(lat, 99) * 1e3:8.3f} "
              f"{max(lat) * 1e3:8.2f} {r['up_cpu'] / r['chunks'] * 1e6:13.1f} ms {r['me_cpu'] / r['chunks'] * 1e6:11.1f} ms")
    d, p, raw = result["direct"], result["proxied"], result["relayed"]
    added50 = _q(p["lat"], 50) - _q(d["lat"], 50)
    added99 = _q(p["lat"], 99) - _q(d["lat"], 99)
    px_per_k = p["px_cpu"] / p["chunks"] * 1e3
    up_per_k = p["up_cpu"] / p["chunks"] * 1e3
    print(f"added by the proxy: p50 {added50 * 1e3:+.3f} ms, p99 {added99 * 1e3:+.3f} ms per chunk "
          f"(proxied/direct p99 = {_q(p['lat'], 99) / _q(d['lat'], 99):.2f}x; target: added p99 < 1 ms)")
    print(f"proxy CPU: {px_per_k * 1e3:.1f} ms per 1,000 chunks = {px_per_k * 1000:.0f}% of a core per 10,000 chunks/s "
          f"(target < 10%); {px_per_k / up_per_k:.2f}x the upstream's own CPU per chunk; "
          f"throughput proxied/direct = {(p['chunks'] / p['wall']) / (d['chunks'] / d['wall']):.2f}")
    raw_per_k = raw["px_cpu"] / raw["chunks"] * 1e3
    print(f"of which relaying alone (a route the proxy does not read: aiohttp in and out): {raw_per_k * 1e3:.1f} ms "
          f"per 1,000 chunks; the accounting (SSE + JSON per chunk, windows): {(px_per_k - raw_per_k) * 1e3:.1f} ms")
    print(json.dumps({"relay_only_cpu_ms_per_1k_chunks": raw_per_k * 1e3, "added_p50_ms": added50 * 1e3, "added_p99_ms": added99 * 1e3,
                      "proxy_cpu_ms_per_1k_chunks": px_per_k * 1e3, "core_share_per_10k_chunks_s": px_per_k * 10,
                      "chunks_per_s_direct": d["chunks"] / d["wall"], "chunks_per_s_proxied": p["chunks"] / p["wall"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
