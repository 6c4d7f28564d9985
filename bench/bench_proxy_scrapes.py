"""Do scrapes of the agent slow the streams `rooflight run --proxy-listen` relays?

`rooflight run` (the agent and its proxy) in a child process, in front of a fake vLLM in this process (a
recorded /metrics page repeated for 64 models, and chat streams: first token after 10 ms, then one every
20 ms), and a second `rooflight run` without a proxy (the control); this process times proxied streams
(three at a time) as their client: alone, while `--scrapers` clients in another process GET the control's
/api/v1/status (four in five) and /metrics back to back (what sharing the machine's cores costs), then while
they scrape the proxy's own agent. Printed per round: TTFT p50 and the p99 of every gap between tokens, each
way, and the proxy's agent against the control (the ratio: 1.0 = the scrapes cost the streams nothing more
than the same scrapes elsewhere). The scenario is tests/agent/proxy/test_proxy_isolation.py's. Timing is
printed, never asserted.

`--before DIR` also runs, round by round, the same measurement against another checkout of rooflight (e.g.
`git worktree add /tmp/before <commit>`), imported through a shim on PYTHONPATH, so both are measured on the
same machine at the same time.

Run from the repository root (the `rooflight` console script installed):
    python bench/bench_proxy_scrapes.py [--scrapers 50] [--rounds 3] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "agent" / "proxy")]

from test_proxy_isolation import Engine, measure  # noqa: E402

PARTS = ("agent", "collectors", "rules", "dashboards")  # pyproject.toml's package-dir: rooflight.<part>


def shim_for(checkout: Path, into: Path) -> dict[str, str]:
    """An environment under which `python -m rooflight` is `checkout`'s code (a shim package first on
    PYTHONPATH, before the editable install's finder)."""
    package = into / "rooflight"
    package.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py"):
        shutil.copy(checkout / "agent" / "_root" / name, package / name)
    for part in PARTS:
        (package / part).symlink_to(checkout / part, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
    env["PYTHONPATH"] = f"{into}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


async def run(scrapers: int, rounds: int, before: Path | None) -> list[dict[str, object]]:
    engine = Engine()
    await engine.start()
    builds: list[tuple[str, list[str] | None, dict[str, str] | None]] = [("now", None, None)]
    scratch = tempfile.mkdtemp()
    if before is not None:
        builds.insert(0, ("before", [sys.executable, "-m", "rooflight"], shim_for(before.resolve(), Path(scratch))))
    out: list[dict[str, object]] = []
    try:
        for i in range(rounds):
            for name, exe, env in builds:
                quiet, elsewhere, loaded = await measure(engine.url, scrapers, exe=exe, env=env)
                row = {"round": i + 1, "build": name}
                for label, (ttft, gap) in (("quiet", quiet), ("elsewhere", elsewhere), ("loaded", loaded)):
                    row[f"{label}_ttft_ms"], row[f"{label}_gap_p99_ms"] = ttft * 1e3, gap * 1e3
                out.append(row)
                print(_line(row), flush=True)
    finally:
        await engine.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def _line(r: dict[str, object]) -> str:
    f = {k: float(v) for k, v in r.items() if k.endswith("_ms")}  # type: ignore[arg-type]
    return (f"{r['round']:>5} {r['build']:>6}  TTFT p50 {f['quiet_ttft_ms']:5.1f} / {f['elsewhere_ttft_ms']:5.1f} / "
            f"{f['loaded_ttft_ms']:5.1f} ms (x{f['loaded_ttft_ms'] / f['elsewhere_ttft_ms']:.2f})   gap p99 "
            f"{f['quiet_gap_p99_ms']:6.1f} / {f['elsewhere_gap_p99_ms']:6.1f} / {f['loaded_gap_p99_ms']:6.1f} ms "
            f"(x{f['loaded_gap_p99_ms'] / f['elsewhere_gap_p99_ms']:.2f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another checkout of rooflight to measure beside this one")
    args = ap.parse_args()
    print(f"bench_proxy_scrapes: {args.scrapers} scrapers, {psutil.cpu_count()} CPUs, load avg "
          f"{', '.join(f'{x:.1f}' for x in psutil.getloadavg())}; per build: quiet / scrapers on another agent / "
          "on the proxy's agent (x its agent against the other)")
    results = asyncio.run(run(args.scrapers, args.rounds, args.before))
    for name in dict.fromkeys(str(r["build"]) for r in results):
        mine = [r for r in results if r["build"] == name]
        ttft = statistics.median(float(r["loaded_ttft_ms"]) / float(r["elsewhere_ttft_ms"]) for r in mine)  # type: ignore[arg-type]
        gap = statistics.median(float(r["loaded_gap_p99_ms"]) / float(r["elsewhere_gap_p99_ms"]) for r in mine)  # type: ignore[arg-type]
        print(f"{name}: median over {len(mine)} rounds, the proxy's agent scraped against another: TTFT p50 x{ttft:.2f},"
              f" gap p99 x{gap:.2f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
