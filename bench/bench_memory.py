"""Resident memory of the agent after minutes on the demo, at 1 Hz and at 10 Hz (target: <= 60 MB, flat).

What is measured is the real `rooflight run` process, scraping a simulated vLLM (the demo engine, in its
own process so its memory is not counted) over loopback and itself scraped by a client every 5 s as
Prometheus would. RSS is read with psutil every 10 s.

    python bench/bench_memory.py [--minutes 6]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request

import psutil

ENGINE = """
import asyncio, sys
from rooflight.agent.demo import DemoConfig, start_demo_engine
async def main():
    engine = await start_demo_engine(DemoConfig(scenario="steady"), "127.0.0.1", int(sys.argv[1]))
    await asyncio.Event().wait()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


def measure(engine_url: str, hz: float, minutes: float) -> list[tuple[float, float]]:
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "rooflight", "run", "--engine-url", engine_url, "--model", "llama-3-8b", "--gpu", "h100-sxm",
         "--interval", f"{1 / hz:g}", "--listen", f"127.0.0.1:{port}", "--log-level", "error"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready")
        proc, series, start = psutil.Process(agent.pid), [], time.monotonic()
        next_scrape = next_read = 0.0
        while (elapsed := time.monotonic() - start) < minutes * 60:
            if elapsed >= next_scrape:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                next_scrape += 5
            if elapsed >= next_read:
                series.append((elapsed, proc.memory_info().rss / 1e6))
                next_read += 10
            time.sleep(0.25)
        cpu = proc.cpu_times()
        print(f"  cpu: {(cpu.user + cpu.system) / (time.monotonic() - start) * 100:.1f}% of one core")
        return series
    finally:
        agent.terminate()
        agent.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="per rate; the 5m window fills in the first 5")
    opts = parser.parse_args(argv)
    print("$ python bench/bench_memory.py " + " ".join(sys.argv[1:] if argv is None else argv))
    report(opts.minutes)
    return 0


def report(minutes: float) -> None:
    """RSS of `rooflight run` on the demo engine at 1 Hz and at 10 Hz, `minutes` each."""
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(port)])
    try:
        wait_http(f"http://127.0.0.1:{port}/metrics")
        for hz in (1.0, 10.0):
            print(f"agent at {hz:g} Hz for {minutes:g} min:")
            series = measure(f"http://127.0.0.1:{port}", hz, minutes)
            rss = [r for _, r in series]
            settled = [r for t, r in series if t >= 330] or rss  # after the 5m window has filled
            print("  rss MB over time: " + " ".join(f"{t:.0f}s={r:.1f}" for t, r in series))
            print(f"  rss: first {rss[0]:.1f} MB, max {max(rss):.1f} MB, last {rss[-1]:.1f} MB;"
                  f" growth once the 5m window is full {settled[-1] - settled[0]:+.1f} MB (target: <= 60 MB, flat)")
    finally:
        engine.terminate()
        engine.wait(10)


if __name__ == "__main__":
    sys.exit(main())
