"""What the proxy costs a stream, side by side with going direct: added TTFT and ITL, CPU per chunk, throughput.

Three parties: a fake OpenAI SSE upstream (its own process; each stream sends chunks at the rate the request
asks for, every chunk carrying the upstream's CLOCK_MONOTONIC send time in nanoseconds as its content), the
proxy (its own process, pinned to `--proxy-cpu` when given, the upstream and this client then kept off that
core; `--workers N` runs `rooflight proxy --workers N` instead of one ProxyServer), and this process as the
client. For each scenario (STREAMS x CHUNKS/S per stream) the client runs phases of `--seconds`: direct,
proxied, and relayed (the proxy on a route it relays without reading: the relay's own cost), alternating,
`--rounds` times, every phase with the same stream start offsets (drawn from `--seed`). Per path it takes:

- TTFT: from just before the request is sent to the first chunk read; ITL: the gaps between a stream's
  chunks as the client reads them (chunks read together have a gap of 0, as a client sees them);
- chunk latency: each chunk's receive time minus its send time (one clock, one machine);
- chunks/s delivered, and the CPU of the proxy (with its workers), upstream and client per chunk.

Printed: a table per scenario, then one markdown row per scenario (the table in docs/proxy.md) and a JSON
line. Latencies include waiting for a core: on a machine with fewer free cores than the parties, they do.
Timing is printed, never asserted.

Run from the repository root:
    python bench/bench_proxy.py --scenarios 64x100,64x1000,256x200 --proxy-cpu 1 [--seconds 5] [--rounds 2]
    python bench/bench_proxy.py --streams 64 --rate 1000 --workers 2       # one scenario, two worker processes
    python bench/bench_proxy.py --scenarios 64x100 --proxy-cpu 1 --baseline /tmp/base-tree  # before/after, one run

`--baseline DIR` runs a second proxy from DIR (another commit's checkout, e.g. `git archive COMMIT | tar -x -C
DIR`, laid out as a package as bench_process_cpu.py's --before does; or a folder holding that build's `rooflight`
package) on the same core, and its paths alternate with the others: both builds see the same machine, phase by
phase.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PATHS = ("direct", "proxied", "relayed")
BASE_PATHS = ("base-proxied", "base-relayed")  # the same through a second proxy of another build (--baseline)


def _wait_listening(port: int, within: float = 60.0) -> None:
    """Back once something accepts on `port` (0: nothing to wait for); RuntimeError after `within` s."""
    deadline = time.monotonic() + within
    while port:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listening on port {port} after {within:g} s") from None
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the fake upstream (its own process) -----------------------------------------------------------------------


def upstream_main(port: int) -> None:
    from aiohttp import web

    head = (b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,'
            b'"delta":{"content":"')
    tail = b'"},"finish_reason":null}]}\n\n'

    async def stream(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seconds, rate = float(body.get("seconds", 5.0)), float(body.get("rate", 100.0))
        named = str(body.get("model", "")).split("-")  # "bench-RATE-SECONDS": for a peer that sends its own body
        if "seconds" not in body and len(named) == 3 and named[0] == "bench":
            rate, seconds = float(named[1]), float(named[2])
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
            await response.write(b'data: {"id":"b","object":"chat.completion.chunk","created":1,"model":"bench",'
                                 b'"choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
                                 b'"usage":{"prompt_tokens":1,"completion_tokens":%d,"total_tokens":%d}}\n\n'
                                 b'data: [DONE]\n\n' % (n, n + 1))
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def health(request: web.Request) -> web.Response:  # (what a router checks before it routes)
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", health)
        app.router.add_post("/v1/chat/completions", stream)
        app.router.add_post("/raw/stream", stream)  # the same stream on a route the proxy only relays
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the proxy (its own process) -------------------------------------------------------------------------------


def proxy_main(upstream: str, port: int, metrics_port: int, cpu: int | None = None, profile: str = "",
               loop: str = "asyncio", source: str = "") -> None:
    import signal

    if source:  # another build's `rooflight` package, found before the installed one
        sys.path.insert(0, source)

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


class Path_:
    """One path's measurements, over all its phases."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.chunks = 0
        self.wall = 0.0
        self.cpu = {"up": 0.0, "px": 0.0, "me": 0.0, "px_sys": 0.0}


async def one_stream(session, url: str, seconds: float, rate: float, delay: float,  # type: ignore[no-untyped-def]
                     out: Path_, model: str = "bench") -> int:
    marker = b'"content":"'
    got = 0
    tail = b""
    last = None
    await asyncio.sleep(delay)
    sent = time.monotonic_ns()
    body = {"model": model, "stream": True, "seconds": seconds, "rate": rate, "messages": [{"role": "user", "content": "x"}]}
    async with session.post(url, json=body) as r:
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
                if i < 0:  # a peer that writes its JSON again may put a space after the colon
                    i = line.find(b'"content": "')
                    if i < 0:
                        continue
                    i += 1
                j = line.find(b'"', i + len(marker))
                if j > i + len(marker) and line[i + len(marker):j].isdigit():
                    out.lat.append((now - int(line[i + len(marker):j])) / 1e9)
                    if last is None:
                        out.ttft.append((now - sent) / 1e9)
                    else:
                        out.itl.append((now - last) / 1e9)
                    last = now
                    got += 1
    return got


async def phase(url: str, streams: int, rate: float, seconds: float, offsets: list[float], out: Path_) -> None:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()
        counts = await asyncio.gather(*(one_stream(session, url, seconds, rate, offsets[i], out) for i in range(streams)))
        out.wall += time.monotonic() - start - min(offsets[:streams], default=0.0)
    out.chunks += sum(counts)


def _q(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))]


def _cpu(procs: list[psutil.Process], system_only: bool = False) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.system if system_only else t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _with_children(p: psutil.Process) -> list[psutil.Process]:
    try:
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [p]


def run_scenario(args: argparse.Namespace, streams: int, rate: float, up_port: int, px_port: int,
                 procs: dict[str, list[psutil.Process]]) -> dict[str, Path_]:
    rng = random.Random(args.seed)
    offsets = [rng.uniform(0.0, min(0.5, 1.0 / rate * 10)) for _ in range(streams)]  # the same for every phase
    urls = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions",
            "proxied": f"http://127.0.0.1:{px_port}/v1/chat/completions",
            "relayed": f"http://127.0.0.1:{px_port}/raw/stream"}
    if args.base_port:
        urls["base-proxied"] = f"http://127.0.0.1:{args.base_port}/v1/chat/completions"
        urls["base-relayed"] = f"http://127.0.0.1:{args.base_port}/raw/stream"
    result = {name: Path_() for name in urls}
    order = args.order.split(",")
    warm = min(4, streams)
    asyncio.run(phase(urls["direct"], warm, rate, 0.5, offsets, Path_()))  # warm up both paths
    asyncio.run(phase(urls["proxied"], warm, rate, 0.5, offsets, Path_()))
    if args.base_port:
        asyncio.run(phase(urls["base-proxied"], warm, rate, 0.5, offsets, Path_()))
    for _ in range(args.rounds):
        for name in order:
            mine = {k: v for k, v in procs.items() if k != "pxb"}
            if name.startswith("base-"):  # the baseline proxy's CPU is this path's proxy CPU
                mine["px"] = procs["pxb"]
            before = {k: _cpu(v) for k, v in mine.items()}
            sys_before = _cpu(mine["px"], system_only=True)
            asyncio.run(phase(urls[name], streams, rate, args.seconds, offsets, result[name]))
            for k, v in mine.items():
                result[name].cpu[k] += _cpu(v) - before[k]
            result[name].cpu["px_sys"] += _cpu(mine["px"], system_only=True) - sys_before
    return result


def report(streams: int, rate: float, result: dict[str, Path_], args: argparse.Namespace) -> dict[str, float]:
    print(f"\n{streams} streams x {rate:g} chunks/s offered ({streams * rate:,.0f} chunks/s), {args.rounds} x "
          f"{args.seconds:g} s per path, load avg {', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
    print(f"{'path':8} {'chunks/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'lat p50':>8} "
          f"{'lat p99':>8} {'proxy us/chunk':>15} {'upstream us/chunk':>18}")
    for name, r in result.items():
        if not r.chunks:
            print(f"{name:8} no chunks received")
            continue
        ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
        print(f"{name:8} {r.chunks / r.wall:9.0f} {ms(_q(r.ttft, 50)):>9} {ms(_q(r.ttft, 99)):>9} {ms(_q(r.itl, 50)):>8} "
              f"{ms(_q(r.itl, 99)):>8} {ms(_q(r.lat, 50)):>8} {ms(_q(r.lat, 99)):>8} "
              f"{r.cpu['px'] / r.chunks * 1e6:15.1f} {r.cpu['up'] / r.chunks * 1e6:18.1f}   "
              f"(proxy in the kernel {r.cpu['px_sys'] / r.chunks * 1e6:.1f})")
    row = _row(streams, rate, result["direct"], result["proxied"], result["relayed"])
    if row and "base-proxied" in result:
        base = _row(streams, rate, result["direct"], result["base-proxied"], result["base-relayed"], "the baseline")
        row["baseline"] = base
    return row


def _row(streams: int, rate: float, d: Path_, p: Path_, raw: Path_, who: str = "the proxy") -> dict[str, float]:
    if not (d.chunks and p.chunks):
        return {}
    row = {
        "streams": streams, "rate": rate,
        "added_ttft_p50_ms": (_q(p.ttft, 50) - _q(d.ttft, 50)) * 1e3,
        "added_ttft_p99_ms": (_q(p.ttft, 99) - _q(d.ttft, 99)) * 1e3,
        "added_itl_p50_ms": (_q(p.itl, 50) - _q(d.itl, 50)) * 1e3,
        "added_itl_p99_ms": (_q(p.itl, 99) - _q(d.itl, 99)) * 1e3,
        "added_latency_p50_ms": (_q(p.lat, 50) - _q(d.lat, 50)) * 1e3,
        "added_latency_p99_ms": (_q(p.lat, 99) - _q(d.lat, 99)) * 1e3,
        "proxy_cpu_us_per_chunk": p.cpu["px"] / p.chunks * 1e6,
        "relay_only_cpu_us_per_chunk": raw.cpu["px"] / raw.chunks * 1e6 if raw.chunks else float("nan"),
        "throughput_ratio": (p.chunks / p.wall) / (d.chunks / d.wall),
        "chunks_per_s_direct": d.chunks / d.wall, "chunks_per_s_proxied": p.chunks / p.wall,
    }
    print(f"added by {who}: TTFT p50 {row['added_ttft_p50_ms']:+.2f} ms, p99 {row['added_ttft_p99_ms']:+.2f} ms; "
          f"ITL p50 {row['added_itl_p50_ms']:+.2f} ms, p99 {row['added_itl_p99_ms']:+.2f} ms; chunk latency p99 "
          f"{row['added_latency_p99_ms']:+.2f} ms; proxy CPU {row['proxy_cpu_us_per_chunk']:.1f} us per chunk (relaying "
          f"alone {row['relay_only_cpu_us_per_chunk']:.1f}) = {row['proxy_cpu_us_per_chunk'] / 100:.2f} cores per 10,000 "
          f"chunks/s; throughput proxied/direct {row['throughput_ratio']:.2f}")
    return row


def start_proxy(args: argparse.Namespace, up_port: int, px_port: int, m_port: int,
                source: str = "") -> tuple[object, psutil.Process]:
    upstream = f"http://127.0.0.1:{up_port}"
    if args.workers > 1:  # the real command, its workers pinned with it
        cmd = [sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", upstream, "--listen",
               f"127.0.0.1:{px_port}", "--metrics-listen", f"127.0.0.1:{m_port}", "--slo", "ttft=0.5,tpot=0.05",
               "--workers", str(args.workers), "--log-level", "warning"]
        if args.proxy_cpu is not None:
            cmd = ["taskset", "-c", args.proxy_cpu, *cmd]
        child = subprocess.Popen(cmd, cwd=ROOT)
        return child, psutil.Process(child.pid)
    ctx = multiprocessing.get_context("spawn")
    cpu = int(args.proxy_cpu) if args.proxy_cpu is not None else None
    px = ctx.Process(target=proxy_main, args=(upstream, px_port, m_port, cpu, args.profile, args.loop, source),
                     daemon=True)
    px.start()
    return px, psutil.Process(px.pid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="", help="STREAMSxRATE,... e.g. 64x100,64x1000,256x200 (else --streams x --rate)")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rate", type=float, default=1000.0, help="chunks per second per stream")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each phase")
    ap.add_argument("--rounds", type=int, default=2, help="direct/proxied/relayed phase triples, alternating")
    ap.add_argument("--order", default=",".join(PATHS), help="the order of the paths in each round")
    ap.add_argument("--seed", type=int, default=28, help="the streams' start offsets (the same in every phase)")
    ap.add_argument("--proxy-cpu", default=None, help="pin the proxy (and its workers) to these cores, e.g. 1 or 2-3; "
                                                     "the upstream and the client go on the others")
    ap.add_argument("--workers", type=int, default=1, help="run `rooflight proxy --workers N` (N > 1)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="the proxy's event loop (one worker)")
    ap.add_argument("--baseline", default="", help="a folder holding another build's `rooflight` package (e.g. a "
                    "symlink tree of an older commit): its proxy runs beside this one (same core) and its paths "
                    "(base-proxied, base-relayed) alternate with the others, for before/after in one run")
    ap.add_argument("--profile", default="", help="cProfile the proxy into this file (slows it: for where, not how much)")
    args = ap.parse_args()
    if args.baseline and args.workers > 1:
        ap.error("--baseline runs one worker per build")
    if args.baseline and not (Path(args.baseline) / "rooflight" / "__init__.py").exists():  # a checkout
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_process_cpu import before_tree

        links = tempfile.TemporaryDirectory(prefix="bench-proxy-baseline-")
        args.baseline = str(before_tree(Path(args.baseline).resolve(), Path(links.name)))
    if args.baseline and args.order == ",".join(PATHS):
        # each proxy's paths one after the other: a proxy idle through another's phase (4 s) would find its
        # kept-alive upstream connections gone and open them all at once (docs/proxy.md, TTFT in a burst)
        args.order = "direct,relayed,proxied,base-relayed,base-proxied"
    scenarios = ([tuple(float(x) for x in s.split("x")) for s in args.scenarios.split(",")] if args.scenarios
                 else [(args.streams, args.rate)])

    ctx = multiprocessing.get_context("spawn")
    up_port, px_port, m_port = _free_port(), _free_port(), _free_port()
    up = ctx.Process(target=upstream_main, args=(up_port,), daemon=True)
    up.start()
    px, px_ps = start_proxy(args, up_port, px_port, m_port)
    args.base_port = 0
    if args.baseline:
        args.base_port = _free_port()
        pxb, pxb_ps = start_proxy(args, up_port, args.base_port, _free_port(), source=args.baseline)
    for port in (px_port, args.base_port, up_port):  # each listening (workers on a loaded machine take a while)
        _wait_listening(port)
    if args.workers > 1:
        time.sleep(1.0)  # the port answers once one worker listens: the others a moment later
    up_ps, me = psutil.Process(up.pid), psutil.Process()
    if args.proxy_cpu is not None:  # the proxy alone on its cores; upstream and client on the rest
        pinned = set()
        for part in args.proxy_cpu.split(","):
            lo, _, hi = part.partition("-")
            pinned |= set(range(int(lo), int(hi or lo) + 1))
        rest = sorted(set(range(psutil.cpu_count())) - pinned) or None
        if rest:
            up_ps.cpu_affinity(rest)
            me.cpu_affinity(rest)
    procs = {"up": [up_ps], "px": _with_children(px_ps), "me": [me]}
    if args.baseline:
        procs["pxb"] = [pxb_ps]
    print(f"bench_proxy: {psutil.cpu_count()} CPUs, proxy {'on core(s) ' + args.proxy_cpu if args.proxy_cpu else 'unpinned'}"
          f", {args.workers} worker process(es), {args.loop} loop, seed {args.seed}")
    rows = []
    try:
        for streams, rate in scenarios:
            rows.append(report(int(streams), rate, run_scenario(args, int(streams), rate, up_port, px_port, procs), args))
    finally:
        stop = [px, up] + ([pxb] if args.baseline else [])
        for p in stop:
            p.terminate()  # type: ignore[attr-defined]
        for p in stop:
            try:
                p.wait(10) if isinstance(p, subprocess.Popen) else p.join(10)  # type: ignore[attr-defined]
            except subprocess.TimeoutExpired:
                p.kill()

    print("\n| offered | added TTFT p50 / p99 | added ITL p50 / p99 | proxy CPU per chunk (relay alone) | proxied/direct |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r:
            print(f"| {int(r['streams'])} x {r['rate']:g}/s | {r['added_ttft_p50_ms']:+.1f} / {r['added_ttft_p99_ms']:+.1f} ms "
                  f"| {r['added_itl_p50_ms']:+.2f} / {r['added_itl_p99_ms']:+.2f} ms | {r['proxy_cpu_us_per_chunk']:.1f} us "
                  f"({r['relay_only_cpu_us_per_chunk']:.1f}) | {r['throughput_ratio']:.2f} |")
            b = r.get("baseline")
            if b:
                print(f"| (baseline) {int(b['streams'])} x {b['rate']:g}/s | {b['added_ttft_p50_ms']:+.1f} / "
                      f"{b['added_ttft_p99_ms']:+.1f} ms | {b['added_itl_p50_ms']:+.2f} / {b['added_itl_p99_ms']:+.2f} ms | "
                      f"{b['proxy_cpu_us_per_chunk']:.1f} us ({b['relay_only_cpu_us_per_chunk']:.1f}) | "
                      f"{b['throughput_ratio']:.2f} |")
    print(json.dumps(rows))
    return 0 if all(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
