"""What pollers, non-reading scrapers and big histograms cost the agent.

Each part runs the real `rooflight run` in its own process against an engine in this process that serves
a page built from the recorded vLLM page (tests/fixtures/engine-samples), and reports figures against a
baseline measured in the same run:

- pollers: /-/healthy latency (p50/p99) with no client, then while N pollers fetch /api/v1/status back to
  back (open status pages, or scripts); the status answer's size; the agent's RSS. Page: M models.
- readers: the agent's RSS before and after K clients ask for /metrics and never read a byte.
- histograms: the RSS growth of an agent watching H models whose 5 latency histograms have 255 buckets
  each, against an agent watching the recorded one-model page, side by side for S seconds (the default
  windows' retention is 5 min: S=330 fills it).

    python bench/serve_bounds.py --parts pollers,readers --models 64
    python bench/serve_bounds.py --parts histograms --hist-seconds 330
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
              "vllm:request_prefill_time_seconds")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] if ordered else float("nan")


def many_models_page(models: int, buckets: int = 0) -> str:
    """The recorded page with its model's series repeated for `models` names; with `buckets`, the
    HISTOGRAMS get that many buckets each (a legal page: under expfmt.MAX_HISTOGRAM_BUCKETS)."""
    out: list[str] = []
    done: set[str] = set()
    for line in SAMPLE.read_text().splitlines():
        family = next((h for h in HISTOGRAMS if line.startswith(h + "_bucket{")), None)
        if buckets and family is not None:
            if family not in done:
                done.add(family)
                labels = re.search(r"\{(.*?),?le=", line)
                base = labels.group(1).rstrip(",") if labels else ""
                for i in range(models):
                    lbl = base.replace('model_name="tiny-llama"', f'model_name="m{i:03d}"')
                    for b in range(buckets - 1):
                        out.append(f'{family}_bucket{{{lbl},le="{0.0001 * 1.05 ** b:.6g}"}} {b * 3 + i}')
                    out.append(f'{family}_bucket{{{lbl},le="+Inf"}} {buckets * 3 + i}')
            continue
        if 'model_name="tiny-llama"' in line and not line.startswith("#"):
            out += [line.replace('model_name="tiny-llama"', f'model_name="m{i:03d}"') for i in range(models)]
        else:
            out.append(line)
    return "\n".join(out) + "\n"


async def engine(body: str) -> tuple[web.AppRunner, str]:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site.port}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def agent(engine_url: str, *extra: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rooflight", "run", "--engine-url", engine_url, "--no-nvml", "--no-process",
        "--model", "llama-3-8b", "--gpu", "h100-sxm", "--listen", f"127.0.0.1:{port}", "--log-level", "error",
        *extra, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "ROOFLIGHT_MAX_BODY_BYTES": str(16 * 2**20)})  # the big pages pass the 4 MiB default
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line:
            raise RuntimeError("the agent exited before serving")
        if "serving" in line:
            asyncio.get_running_loop().create_task(_drain(proc.stdout))
            return proc, f"http://127.0.0.1:{port}"


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


def rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024  # type: ignore[union-attr]


async def _healthy_latencies(s: aiohttp.ClientSession, base: str, seconds: float) -> list[float]:
    out, stop = [], time.monotonic() + seconds
    while time.monotonic() < stop:
        start = time.monotonic()
        async with s.get(base + "/-/healthy") as r:
            await r.read()
        out.append(time.monotonic() - start)
        await asyncio.sleep(0.05)
    return out


async def pollers(models: int, clients: int, seconds: float) -> dict[str, Any]:
    runner, url = await engine(many_models_page(models))
    proc, base = await agent(url)
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(120):  # wait for the windows to fill: the status has series and windows
                async with s.get(base + "/api/v1/status") as r:
                    body = await r.json()
                if any(x["windows"] for t in body["targets"] for x in t["series"]):
                    break
                await asyncio.sleep(1)
            quiet = await _healthy_latencies(s, base, 5)
            stop = time.monotonic() + seconds
            sizes: list[int] = []

            async def poll() -> None:
                while time.monotonic() < stop:
                    async with s.get(base + "/api/v1/status") as r:
                        sizes.append(len(await r.read()))

            tasks = [asyncio.create_task(poll()) for _ in range(clients)]
            await asyncio.sleep(1)
            busy = await _healthy_latencies(s, base, seconds - 1)
            await asyncio.gather(*tasks)
        return {"models": models, "pollers": clients, "status_polls": len(sizes),
                "status_bytes": max(sizes) if sizes else 0,
                "healthy_p50_ms_quiet": round(1000 * percentile(quiet, 50), 1),
                "healthy_p99_ms_quiet": round(1000 * percentile(quiet, 99), 1),
                "healthy_p50_ms_polled": round(1000 * percentile(busy, 50), 1),
                "healthy_p99_ms_polled": round(1000 * percentile(busy, 99), 1),
                "p99_polled_over_quiet": round(percentile(busy, 99) / percentile(quiet, 99), 2),
                "agent_rss_mib": round(rss_mib(proc.pid), 1)}
    finally:
        proc.terminate()
        await proc.wait()
        await runner.cleanup()


async def readers(models: int, clients: int) -> dict[str, Any]:
    runner, url = await engine(many_models_page(models))
    proc, base = await agent(url)
    held: list[socket.socket] = []
    try:
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(3)
            async with s.get(base + "/metrics") as r:
                size = len(await r.read())
        before = rss_mib(proc.pid)
        port = int(base.rsplit(":", 1)[1])
        for _ in range(clients):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", port))
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(c)
        await asyncio.sleep(5)
        after = rss_mib(proc.pid)
        return {"metrics_bytes": size, "clients": clients, "rss_before_mib": round(before, 1),
                "rss_after_mib": round(after, 1), "rss_growth_mib": round(after - before, 1),
                "growth_over_one_page": round((after - before) * 2**20 / size, 1)}
    finally:
        for c in held:
            c.close()
        proc.terminate()
        await proc.wait()
        await runner.cleanup()


async def histograms(models: int, buckets: int, seconds: float) -> dict[str, Any]:
    big_runner, big_url = await engine(many_models_page(models, buckets))
    small_runner, small_url = await engine(SAMPLE.read_text())
    big, _ = await agent(big_url)
    small, _ = await agent(small_url)
    try:
        await asyncio.sleep(20)
        start = {"big": rss_mib(big.pid), "small": rss_mib(small.pid)}
        trace = []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            await asyncio.sleep(min(30, max(0.1, stop - time.monotonic())))
            trace.append((round(seconds - (stop - time.monotonic())), round(rss_mib(big.pid), 1),
                          round(rss_mib(small.pid), 1)))
        end = {"big": rss_mib(big.pid), "small": rss_mib(small.pid)}
        return {"models": models, "buckets": buckets, "seconds": seconds,
                "big_rss_mib": [round(start["big"], 1), round(end["big"], 1)],
                "baseline_rss_mib": [round(start["small"], 1), round(end["small"], 1)],
                "big_growth_mib": round(end["big"] - start["big"], 1),
                "baseline_growth_mib": round(end["small"] - start["small"], 1),
                "trace_s_big_baseline": trace}
    finally:
        for proc in (big, small):
            proc.terminate()
            await proc.wait()
        await big_runner.cleanup()
        await small_runner.cleanup()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    parts = {p.strip() for p in args.parts.split(",")}
    if "pollers" in parts:
        out["pollers"] = await pollers(args.models, args.pollers, args.seconds)
    if "readers" in parts:
        out["readers"] = await readers(args.models, args.readers)
    if "histograms" in parts:
        out["histograms"] = await histograms(args.hist_models, args.buckets, args.hist_seconds)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="pollers,readers,histograms")
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--pollers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--readers", type=int, default=250)
    parser.add_argument("--hist-models", type=int, default=25)
    parser.add_argument("--buckets", type=int, default=255)
    parser.add_argument("--hist-seconds", type=float, default=330.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
