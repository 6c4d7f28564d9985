"""Do scrapes of the agent slow the streams `rooflight run --proxy-listen` relays?

`rooflight run` (the agent and its proxy) in a child process, in front of a fake vLLM in this process (a
recorded /metrics page repeated for 64 models, and chat streams: first token after 50 ms, then one every
20 ms); this process times proxied streams (three at a time) as their client, first alone, then while
`--scrapers` clients in a third process GET the agent's /api/v1/status (four in five) and /metrics back
to back. Printed per round: median TTFT and median worst gap between tokens, quiet and loaded, and what
the scrapers added. The scenario is tests/agent/proxy/test_proxy_isolation.py's. Timing is printed, never
asserted.

Run from the repository root (the `rooflight` console script installed):
    python bench/bench_proxy_scrapes.py [--scrapers 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "agent" / "proxy")]

from test_proxy_isolation import Engine, measure  # noqa: E402


async def run(scrapers: int, rounds: int) -> list[dict[str, float]]:
    engine = Engine()
    await engine.start()
    out = []
    try:
        for _ in range(rounds):
            quiet, loaded = await measure(engine.url, scrapers)
            out.append({"quiet_ttft_ms": quiet[0] * 1e3, "loaded_ttft_ms": loaded[0] * 1e3,
                        "quiet_gap_ms": quiet[1] * 1e3, "loaded_gap_ms": loaded[1] * 1e3})
    finally:
        await engine.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = asyncio.run(run(args.scrapers, args.rounds))
    print(f"bench_proxy_scrapes: {args.scrapers} scrapers, {psutil.cpu_count()} CPUs, "
          f"load avg {', '.join(f'{x:.1f}' for x in psutil.getloadavg())}")
    print(f"{'round':>5} {'TTFT quiet':>11} {'loaded':>8} {'added':>7} {'worst gap quiet':>16} {'loaded':>8} {'added':>7}")
    for i, r in enumerate(results, 1):
        print(f"{i:5} {r['quiet_ttft_ms']:8.0f} ms {r['loaded_ttft_ms']:5.0f} ms "
              f"{r['loaded_ttft_ms'] - r['quiet_ttft_ms']:+4.0f} ms {r['quiet_gap_ms']:13.0f} ms "
              f"{r['loaded_gap_ms']:5.0f} ms {r['loaded_gap_ms'] - r['quiet_gap_ms']:+4.0f} ms")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
