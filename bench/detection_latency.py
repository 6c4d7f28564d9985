"""Detection latency: from the demo's injected stall (or KV wall) to the agent's detector, and to the alert.

    python bench/detection_latency.py [--rules short|production] [--warmup S] [--timeout S]

One run, in one process: two simulated vLLM engines (rooflight.agent.demo, scenario steady, seeded differently),
one Agent sampling both every 1 s and serving /metrics on 127.0.0.1, and Debian's Prometheus
(tests/promstack.py: scrape and rule evaluation every 1 s) scraping the agent and both engines with
our rules loaded. After `--warmup` seconds (the agent's ITL baseline needs ~30 s) the bench injects at
the same moment a long prompt into engine A and a KV-wall burst into engine B, then measures from the
injection's monotonic time:
  (a) the first agent Snapshot whose verdict flips (polled every 50 ms in the agent's event loop):
      head_of_line on A, capacity_capped on B;
  (b) the first ALERTS{alertname=...} (pending) for that target in Prometheus (polled every 100 ms);
and prints both and b/a per event. Timing is printed, never asserted.

`--rules short` (default) loads the rules the end-to-end test uses (tests/e2e/test_alerts_e2e.py's SHORT: the
production rules with detector windows of 20 s), so (b) measures the pipeline: detection, scrape,
evaluation and the share of the window the flag must hold. `--rules production` loads the shipped
rules: their detector alerts need the flag for 25% (head-of-line) or 50% (capacity) of 10 minutes,
averaged over the samples Prometheus has, so on a fresh Prometheus (b) depends on `--warmup`; in a
steady state it is at least 150 s and 300 s, and one stall (flag held 30 s) never goes pending.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]  # the test helpers it reuses

from aiohttp import web  # noqa: E402

from rooflight.agent.config.agent import build  # noqa: E402
from rooflight.agent.demo import DemoConfig, start_demo_engine  # noqa: E402
from rooflight.agent.sampling.sampler import Agent  # noqa: E402
from rooflight.agent.serve.server import build_app  # noqa: E402
from rooflight.rules.config import RulesConfig  # noqa: E402
from rooflight.rules.render import render  # noqa: E402
import promstack  # noqa: E402

POLL_AGENT = 0.05
POLL_PROMETHEUS = 0.1


@dataclass
class Event:
    """One injection on one engine, the verdict it should flip and the alert it should raise."""

    name: str  # the demo event: long-prompt, kv-wall
    verdict: str  # attribute of rooflight.agent.signals.detectors.Verdicts
    alert: str
    rule: str  # the detector whose alert it is (RulesConfig.detector_alert)
    target: str = ""
    injected: float = 0.0  # monotonic, as DemoEngine.inject returns it
    detected: float | None = None
    pending: float | None = None


EVENTS = (
    Event("long-prompt", "head_of_line", "RooflightHeadOfLineBlocking", "head_of_line"),
    Event("kv-wall", "capacity_capped", "RooflightBatchCapacityCapped", "capacity_capped"),
)


def rules_config(which: str) -> RulesConfig:
    if which == "production":
        return RulesConfig()
    from test_alerts_e2e import SHORT

    return SHORT


def _verdict(agent: Agent, target: str, name: str) -> bool:
    for t in agent.snapshot.targets:
        if t.name == target:
            return any(s.verdicts is not None and getattr(s.verdicts, name) is True for s in t.series)
    return False


async def _watch_agent(agent: Agent, events: list[Event], deadline: float) -> None:
    while time.monotonic() < deadline and any(e.detected is None for e in events):
        for e in events:
            if e.detected is None and _verdict(agent, e.target, e.verdict):
                e.detected = time.monotonic()
        await asyncio.sleep(POLL_AGENT)


def _watch_prometheus(prom: promstack.PromStack, events: list[Event], deadline: float) -> None:
    while time.monotonic() < deadline and any(e.pending is None for e in events):
        for e in events:
            if e.pending is None and prom.query(f'ALERTS{{alertname="{e.alert}", target="{e.target}"}}'):
                e.pending = time.monotonic()
        time.sleep(POLL_PROMETHEUS)


async def run(which: str, warmup: float, timeout: float, rules_dir: Path) -> list[Event]:
    engines = [await start_demo_engine(DemoConfig(scenario="steady", seed=seed)) for seed in (1, 2)]
    events = [Event(e.name, e.verdict, e.alert, e.rule) for e in EVENTS]
    for e, engine in zip(events, engines):
        e.target = engine.url.removeprefix("http://")
    config = build({}, {}, {"engine_url": [e.url for e in engines], "interval": "1s", "nvml": False,
                            "process": False, "gpu": "h100-sxm"})
    agent = Agent(config)
    runner = web.AppRunner(build_app(agent), access_log=None)
    await runner.setup()
    port = promstack.free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    rules = rules_dir / f"rooflight-{which}.rules.yaml"
    rules.write_text(render(rules_config(which)))
    scrape = [f"127.0.0.1:{port}", *(e.target for e in events)]
    try:
        with promstack.PromStack(scrape, [rules]) as prom:
            await asyncio.to_thread(prom.wait_for, "rooflight_source_up == 1", 60.0)
            await asyncio.sleep(warmup)
            for e, engine in zip(events, engines):
                e.injected = engine.inject(e.name)
            deadline = time.monotonic() + timeout
            await asyncio.gather(_watch_agent(agent, events, deadline),
                                 asyncio.to_thread(_watch_prometheus, prom, events, deadline))
            return events
    finally:
        await runner.cleanup()
        for engine in engines:
            await engine.stop()


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:6.2f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", choices=("short", "production"), default="short")
    parser.add_argument("--warmup", type=float, default=40.0, help="seconds of steady traffic before injecting")
    parser.add_argument("--timeout", type=float, default=150.0, help="give up this long after the injection")
    args = parser.parse_args(argv)
    if not promstack.available():
        print("Debian's prometheus is not on PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    import tempfile

    print(f"$ python bench/detection_latency.py --rules {args.rules} --warmup {args.warmup:g} "
          f"--timeout {args.timeout:g}")
    print("scrape + evaluation every 1 s; agent samples every 1 s; agent polled every "
          f"{POLL_AGENT * 1000:.0f} ms, Prometheus every {POLL_PROMETHEUS * 1000:.0f} ms")
    with tempfile.TemporaryDirectory(prefix="detection-latency-") as tmp:
        events = asyncio.run(run(args.rules, args.warmup, args.timeout, Path(tmp)))
    print(f"{'event':<12} {'detector flips':>15} {'alert pending':>14} {'pending/detector':>17}")
    for e in events:
        a = None if e.detected is None else e.detected - e.injected
        b = None if e.pending is None else e.pending - e.injected
        ratio = f"{b / a:16.1f}x" if a and b is not None else f"{'n/a':>17}"
        d = rules_config(args.rules).detector_alert(e.rule)
        print(f"{e.name:<12} {_s(a):>15} {_s(b):>14} {ratio}   ({e.verdict} -> {e.alert}: pending once the flag "
              f"held {d.min_fraction:.0%} of {d.window})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
