"""What the whole agent process costs, beside a naive fetch-and-parse sidecar doing less on the same pages.

bench/bench_sampling.py times the parse and one cycle inside one process; a user pays for the whole
`rooflight run` process: its HTTP client, its event loop and threads, every source (NVML is on by
default and, with no GPU, retried; the process source reads the engine's process tree), the windows
and the derivations. This bench runs, at the same time and against the same pages:

- a fake engine (this file with --serve, a subprocess): an aiohttp server on 127.0.0.1 serving
  tests/fixtures/engine-samples/vllm-cpu-load-c16.prom at /metrics on one port per target of the
  largest configuration (at least 8; 64 for 64x1, a node agent beside DP-heavy engines), its counters
  and histograms moving every 100 ms as bench/bench_sampling.py's moving pages do, and /v1/models;
- the agent as a user runs it: `python -m rooflight run --engine-url URL [--engine-url URL ...]
  --interval I --model llama-3-8b` (defaults otherwise: the NVML and process sources on);
- the naive sidecar (bench/naive_scraper.py): one aiohttp ClientSession.get per URL per tick plus
  prometheus_client's text_string_to_metric_families over the whole page, nothing else;
- a Prometheus stand-in (a thread here) scraping the agent's /metrics every `--scrape-every` s (15);

and measures each one's CPU (user + system, psutil, the process and its children) over the same
`--seconds` after `--warmup` (160 s by default: the agent derives its 5m window once its history spans
half of it, so a shorter warm-up measures an agent doing less than it will from then on). Configurations are
targets x rate (1x10, 8x1, 64x1, ...): N targets are N ports, so N engine URLs, each page rendered once per
100 ms tick whoever asks. Printed per configuration: the agent's and the naive loop's CPU in %
of one core, agent/naive, the pages each read per second (both must keep up for the ratio to mean
anything), the TCP connections each opened while measured (0 with keep-alive), the fake engine's
CPU, the machine's busy share and load. `--runs N` repeats every configuration, interleaved, so a
change in the machine's load hits each.

`--before DIR` (a checkout of another commit, e.g. `git archive BASE | tar -x -C DIR`) runs that
checkout's agent too, at the same time, against the same pages (at /before/metrics, so each side's
pages are counted apart), and prints its CPU beside this one's: a before/after comparison measured over
the same seconds on the same busy machine.

`--profile CONFIG` (e.g. 1x10) then runs that configuration once more with py-spy (`record --format
raw`, every thread, idle ones excluded) attached to the agent, and prints where its CPU goes: by
step of its work (fetch, parse, history, derivations and detectors, publish, process and NVML
sources, /metrics), by the module of the innermost frame (what burns it: aiohttp, expfmt, asyncio, ...) and by the
innermost rooflight module on the stack (which of our components caused it; stacks without one,
the event loop's own work, are shown by the leaf's module). py-spy counts a thread that is runnable
but waiting for a core as active: the socket write that wakes the fake engine, or the epoll wait
that returns to a busy machine, looks costlier there than it is; the psutil shares are the real cost.

Figures are printed, never asserted. On a busy machine the CPU shares are noisy; the ratio, measured
over the same seconds, is the steadier figure.

Run from the repository root:
    python bench/bench_process_cpu.py [--configs 1x1,1x10,8x1,8x10,64x1] [--seconds 20] [--runs 3] [--profile 1x10]
                                      [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_PAGE = ROOT / "tests" / "fixtures" / "engine-samples" / "vllm-cpu-load-c16.prom"
NAIVE = ROOT / "bench" / "naive_scraper.py"
MIN_PORTS = 8
BEFORE = "/before"  # the path prefix the --before agent reads its pages under
PAGE_EVERY_S = 0.1  # the fake engine's counters move this often
AGENT_ACCEPT = "text/plain;version=0.0.4"  # how the fake engine tells the agent's requests from the naive loop's
MODEL = "llama-3-8b"
# The agent derives a window once its history spans half of it: the 5m window from 150 s on. Measured
# sooner, the agent does less work than it will for the rest of its life.
WARMUP_S = 160.0


# --- the fake engine (child process) -------------------------------------------------------------------


def serve(page_file: Path, ports: int) -> None:
    """Serve moving pages on `ports` ports of 127.0.0.1; print the ports as one JSON line; run until killed."""
    from aiohttp import web

    from bench.bench_sampling import LOAD, SEED, STEP, page_template, render

    template, rng = page_template(page_file.read_text()), random.Random(SEED)
    start = time.monotonic()
    state = {"tick": -1, "growth": 1.0, "body": b""}
    counts = collections.Counter[str]()
    peers: set[Any] = set()

    def body() -> bytes:
        """The page of the current 100 ms tick, rendered once per tick whoever asks."""
        tick = int((time.monotonic() - start) / PAGE_EVERY_S)
        if tick != state["tick"]:
            load = rng.uniform(*LOAD)
            state["growth"] += STEP * load * PAGE_EVERY_S * max(1, tick - state["tick"])
            state["tick"], state["body"] = tick, render(template, state["growth"], load).encode()
        return state["body"]

    async def metrics(request: web.Request) -> web.Response:
        if request.path.startswith(BEFORE):
            who = "before"
        else:
            who = "agent" if request.headers.get("Accept", "").startswith(AGENT_ACCEPT) else "naive"
        counts[who] += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer not in peers:  # a new connection: keep-alive would reuse the last one
            peers.add(peer)
            counts[f"{who}_connections"] += 1
        return web.Response(body=body(), content_type="text/plain", charset="utf-8")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny-llama", "object": "model",
                                                               "max_model_len": 2048}]})

    async def served(_: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    async def main() -> None:
        app = web.Application()
        for prefix in ("", BEFORE):
            app.router.add_get(prefix + "/metrics", metrics)
            app.router.add_get(prefix + "/v1/models", models)
        app.router.add_get("/counts", served)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        bound = []
        for _ in range(ports):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            bound.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        print(json.dumps(bound), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# --- measuring ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    targets: int
    hz: float

    @property
    def label(self) -> str:
        return f"{self.targets} target{'s' if self.targets > 1 else ''} @ {self.hz:g} Hz"

    @classmethod
    def parse(cls, text: str) -> "Config":
        targets, _, hz = text.partition("x")
        return cls(int(targets), float(hz))


@dataclass(frozen=True)
class Result:
    config: Config
    agent_pct: float
    naive_pct: float
    agent_pages_s: float
    naive_pages_s: float
    agent_connections: int  # TCP connections opened while measured (keep-alive: 0)
    naive_connections: int
    scrapes: int  # of the agent's /metrics while measured
    server_pct: float
    busy_pct: float  # the whole machine, all cores, % of its capacity
    load: float  # 1-minute load average at the end
    before_pct: float | None = None  # the --before checkout's agent, measured over the same seconds
    before_pages_s: float = 0.0
    before_connections: int = 0

    @property
    def ratio(self) -> float:
        return self.agent_pct / self.naive_pct if self.naive_pct else float("nan")

    @property
    def before_ratio(self) -> float:
        return self.before_pct / self.naive_pct if self.naive_pct and self.before_pct is not None else float("nan")

    def line(self) -> str:
        before = "" if self.before_pct is None else (
            f"   before {self.before_pct:5.2f}% (ratio {self.before_ratio:.3f}, pages/s {self.before_pages_s:5.1f},"
            f" new connections {self.before_connections})")
        return (f"{self.config.label:<18} agent {self.agent_pct:5.2f}%  naive {self.naive_pct:6.2f}%  "
                f"ratio {self.ratio:.3f}   pages/s agent {self.agent_pages_s:5.1f} naive {self.naive_pages_s:5.1f}"
                f"   new connections {self.agent_connections}/{self.naive_connections}   agent scraped {self.scrapes}x"
                f"   fake engine {self.server_pct:5.1f}%  machine busy {self.busy_pct:3.0f}%  load {self.load:.1f}"
                + before)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (0 for one that is gone)."""
    try:
        proc = psutil.Process(pid)
        tree = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in tree:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def served(port: int) -> Mapping[str, int]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/counts", timeout=5) as response:
        return json.loads(response.read())


def agent_command(urls: Iterable[str], hz: float, listen: int) -> list[str]:
    """`rooflight run` as a user starts it: every source at its default, a model given."""
    cmd = [sys.executable, "-m", "rooflight", "run", "--interval", f"{1 / hz:g}", "--model", MODEL,
           "--listen", f"127.0.0.1:{listen}", "--log-level", "warning"]
    for url in urls:
        cmd += ["--engine-url", url]
    return cmd


def start_server(page_file: Path, ports: int) -> tuple[subprocess.Popen[str], list[int]]:
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(ports), "--file", str(page_file)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    return server, json.loads(server.stdout.readline())


def stop(proc: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Prometheus(threading.Thread):
    """Scrapes the agent's /metrics every `every` seconds, as a Prometheus server would, until stopped."""

    def __init__(self, port: int, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.every, self.scrapes = f"http://127.0.0.1:{port}/metrics", every, 0
        self.stopping = threading.Event()

    def run(self) -> None:
        import urllib.request

        while self.every > 0 and not self.stopping.wait(self.every):
            try:
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                pass


def before_tree(checkout: Path, into: Path) -> Path:
    """A folder that imports `rooflight` from another checkout (links laid out as pyproject.toml maps
    the package), to put first on the --before agent's PYTHONPATH."""
    pkg = into / "rooflight"
    pkg.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py"):
        (pkg / name).symlink_to(checkout / "agent" / "_root" / name)
    for name, folder in (("agent", "agent"), ("collectors", "collectors"), ("rules", "rules"),
                         ("dashboards", "dashboards")):
        (pkg / name).symlink_to(checkout / folder)
    return into


def measure(config: Config, server: subprocess.Popen[str], ports: list[int], seconds: float, warmup: float,
            scrape_every: float, profile_to: Path | None = None, profile_rate: int = 250,
            before: Path | None = None) -> Result:
    """Agent and naive loop side by side on the same pages; CPU over `seconds` after `warmup`. With
    `before` (a folder from before_tree), that checkout's agent runs beside them, over the same seconds."""
    bases = [f"http://127.0.0.1:{p}" for p in ports[: config.targets]]
    log = tempfile.NamedTemporaryFile("w+", prefix="rooflight-bench-agent-", suffix=".log", delete=False)
    listen = free_port()
    agent = subprocess.Popen(agent_command(bases, config.hz, listen), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    prometheus = Prometheus(listen, scrape_every)
    prometheus.start()
    old: subprocess.Popen[Any] | None = None
    if before is not None:
        before_listen = free_port()
        env = {**os.environ, "PYTHONPATH": str(before)}
        old = subprocess.Popen(agent_command([b + BEFORE for b in bases], config.hz, before_listen), stdout=log,
                               stderr=subprocess.STDOUT, cwd=before, env=env)
        old_prometheus = Prometheus(before_listen, scrape_every)
        old_prometheus.start()
    naive = subprocess.Popen([sys.executable, str(NAIVE), "--interval", f"{1 / config.hz:g}",
                              *(b + "/metrics" for b in bases)], stdout=subprocess.DEVNULL)
    spy: subprocess.Popen[bytes] | None = None
    try:
        time.sleep(warmup)
        for proc in (agent, old):
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"an agent exited ({proc.returncode}): {Path(log.name).read_text()[-2000:]}")
        if profile_to is not None:
            spy = subprocess.Popen([_py_spy(), "record", "--pid", str(agent.pid), "--duration", f"{seconds:g}",
                                    "--rate", str(profile_rate), "--format", "raw", "--full-filenames", "--nonblocking",
                                    "-o", str(profile_to)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        psutil.cpu_percent(None)
        s0 = prometheus.scrapes
        measured = (("agent", agent), ("naive", naive), ("server", server), *((("before", old),) if old else ()))
        c0 = {name: cpu_seconds(p.pid) for name, p in measured}
        n0, w0 = served(ports[0]), time.monotonic()
        time.sleep(seconds)
        c1 = {name: cpu_seconds(p.pid) for name, p in measured}
        n1, wall, scrapes = served(ports[0]), time.monotonic() - w0, prometheus.scrapes - s0
        busy = psutil.cpu_percent(None)
        if spy is not None:
            spy.wait(seconds + 30)
        for proc in (agent, old):
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"an agent exited ({proc.returncode}): {Path(log.name).read_text()[-2000:]}")
    finally:
        prometheus.stopping.set()
        stop(agent)
        if old is not None:
            old_prometheus.stopping.set()
            stop(old)
        stop(naive)
        if spy is not None:
            stop(spy)
    pct = {k: 100.0 * (c1[k] - c0[k]) / wall for k in c0}
    sides = ("agent", "naive", "before")
    pages = {k: (n1.get(k, 0) - n0.get(k, 0)) / wall for k in sides}  # every port
    os.unlink(log.name)
    opened = {k: n1.get(f"{k}_connections", 0) - n0.get(f"{k}_connections", 0) for k in sides}
    return Result(config, pct["agent"], pct["naive"], pages["agent"], pages["naive"], opened["agent"],
                  opened["naive"], scrapes, pct["server"], busy, os.getloadavg()[0], pct.get("before"),
                  pages["before"], opened["before"])


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    return found


# --- the breakdown -------------------------------------------------------------------------------------------

_ENTRY = {"cli", "_root/__main__"}  # frames every stack passes through: they charge nothing
# The steps of the agent's work, by function (the innermost one on a stack names its step): the fetch
# inside the scrape is its own step, the scrape's remainder is the parse.
STEPS = {
    "fetch_text": "engine: HTTP fetch (collectors.http)",
    "EngineLoop._scrape": "engine: parse (expfmt + adapter)",
    "EngineLoop._remember": "engine: history append (windows)",
    "EngineLoop._rebuild_view": "engine: windows, detectors, view (derive, headroom)",
    "EngineLoop._refresh_info": "engine: info endpoint",
    "EngineLoop.sample_once": "engine: the rest of a sample",
    "Agent.publish": "snapshot publish",
    "_read_trees": "process source (psutil, in a thread)",
    "ProcessCollector.read": "process source (psutil, in a thread)",
    "NvmlCollector.sample": "NVML source",
    "NvmlCollector._sample_sync": "NVML source",
    "render_metrics": "/metrics render (on its thread)",
    "handle": "/metrics request",
}
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/)(?P<mod>[^/]+?)(?:\.py)?(?:/|$)")
_SITE = re.compile(r"/site-packages/(?P<pkg>[^/]+?)(?:\.py|\.cpython[^/]*)?(?:/|$)")


def component(path: str) -> tuple[str, bool]:
    """The module group a frame's file belongs to, and whether it is rooflight's own code."""
    if (m := _SITE.search(path)) is not None:
        return m["pkg"], False
    root = str(ROOT) + "/"
    if path.startswith(root):
        rel = path[len(root):].removesuffix(".py").removeprefix("agent/")
        return rel.replace("/", "."), rel not in _ENTRY
    if (m := _STDLIB.search(path)) is not None:
        return m["mod"], False
    return path if path.startswith("<") else Path(path).name, False


def step(funcs: list[str]) -> str:
    """The step of the agent's work a stack belongs to: its innermost function named in STEPS."""
    for func in reversed(funcs):
        for name, label in STEPS.items():
            if func == name or func.startswith(name + "."):
                return label
    return "the rest: event loop, loop scheduling, threads' wake-ups"


def breakdown(raw: Path) -> tuple[collections.Counter[str], collections.Counter[str], collections.Counter[str], int]:
    """Samples by the innermost frame's module, by the innermost rooflight module, by step; and in all."""
    leaf, ours, steps, total = collections.Counter[str](), collections.Counter[str](), collections.Counter[str](), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        matched = [m for f in stack.split(";") if (m := _FRAME.match(f)) is not None]
        frames = [component(m["file"]) for m in matched]
        if not frames:
            continue
        steps[step([m["func"] for m in matched])] += n
        leaf[frames[-1][0]] += n
        own = next((name for name, mine in reversed(frames) if mine), None)
        ours[own if own is not None else f"(event loop, no rooflight frame) {frames[-1][0]}"] += n
    return leaf, ours, steps, total


def print_breakdown(raw: Path, seconds: float, rate: float, top: int = 18) -> None:
    leaf, ours, steps, total = breakdown(raw)
    if not total:
        print("py-spy recorded nothing (may this user ptrace the agent?)")
        return
    print(f"py-spy: {total} samples of active threads at {rate:g} Hz over {seconds:g} s"
          f" (~{100 * total / rate / seconds:.1f}% of a core)")
    for title, counts in (("by step of the agent's work", steps),
                          ("by the module of the innermost frame (what burns the CPU)", leaf),
                          ("by the innermost rooflight module on the stack (who asked for it)", ours)):
        print(f"  {title}:")
        for name, n in counts.most_common(top):
            print(f"    {100 * n / total:5.1f}%  ~{100 * n / rate / seconds:5.2f}% of a core  {name}")


# --- main -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--file", type=Path, default=DEFAULT_PAGE)
    args.add_argument("--configs", default="1x1,1x10,8x1,8x10", help="targets x Hz, comma-separated")
    args.add_argument("--seconds", type=float, default=20.0, help="measured seconds per configuration (>= 20)")
    args.add_argument("--warmup", type=float, default=WARMUP_S,
                      help="seconds before measuring: until every default window is derived (steady state)")
    args.add_argument("--scrape-every", type=float, default=15.0,
                      help="seconds between scrapes of the agent's /metrics, as Prometheus (0: none)")
    args.add_argument("--runs", type=int, default=1, help="rounds over every configuration, interleaved")
    args.add_argument("--profile", help="a configuration (e.g. 1x10) to run once more under py-spy")
    args.add_argument("--profile-seconds", type=float, default=60.0, help="seconds py-spy records (more: finer)")
    args.add_argument("--profile-rate", type=int, default=250, help="py-spy's samples per second")
    args.add_argument("--profile-out", type=Path, help="keep py-spy's raw stacks in this file")
    args.add_argument("--before", type=Path, help="another checkout whose agent runs beside this one, measured alike")
    args.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    opts = args.parse_args(argv)
    if opts.serve:
        serve(opts.file, opts.serve)
        return 0

    print("$ python bench/bench_process_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv))
    print(f"page: {opts.file.name}, counters moving every {PAGE_EVERY_S:g} s; {os.cpu_count()} cores;"
          f" python {sys.version.split()[0]}; load before {os.getloadavg()[0]:.1f}")
    configs = [Config.parse(c) for c in opts.configs.split(",") if c]
    profiled = [Config.parse(opts.profile)] if opts.profile else []
    server, ports = start_server(opts.file, max([MIN_PORTS, *(c.targets for c in configs + profiled)]))
    results: dict[Config, list[Result]] = {c: [] for c in configs}
    links = tempfile.TemporaryDirectory(prefix="rooflight-bench-before-")
    before = before_tree(opts.before.resolve(), Path(links.name)) if opts.before else None
    if opts.before:
        print(f"before: the agent of {opts.before} runs beside this one ({ROOT}), on the same pages")
    try:
        for run in range(opts.runs):
            print(f"run {run + 1}: CPU in % of one core over {opts.seconds:g} s after {opts.warmup:g} s")
            for config in configs:
                result = measure(config, server, ports, opts.seconds, opts.warmup, opts.scrape_every, before=before)
                results[config].append(result)
                print("  " + result.line(), flush=True)
        if opts.runs > 1:
            print(f"over {opts.runs} runs (min-max):")
            for config, rs in results.items():
                print(f"  {config.label:<18} agent {min(r.agent_pct for r in rs):.2f}-{max(r.agent_pct for r in rs):.2f}%"
                      f"  naive {min(r.naive_pct for r in rs):.2f}-{max(r.naive_pct for r in rs):.2f}%"
                      f"  ratio {min(r.ratio for r in rs):.3f}-{max(r.ratio for r in rs):.3f}"
                      f"  load {min(r.load for r in rs):.1f}-{max(r.load for r in rs):.1f}")
                if before is not None:
                    print(f"  {'  before':<18} agent {min(r.before_pct or 0 for r in rs):.2f}-"
                          f"{max(r.before_pct or 0 for r in rs):.2f}%"
                          f"  ratio {min(r.before_ratio for r in rs):.3f}-{max(r.before_ratio for r in rs):.3f}")
        if opts.profile:
            config = Config.parse(opts.profile)
            with tempfile.TemporaryDirectory() as tmp:
                raw = opts.profile_out or Path(tmp) / "agent.txt"
                result = measure(config, server, ports, opts.profile_seconds, opts.warmup, opts.scrape_every,
                                 profile_to=raw, profile_rate=opts.profile_rate)
                print(f"profile run ({config.label}, py-spy attached):")
                print("  " + result.line())
                print_breakdown(raw, opts.profile_seconds, opts.profile_rate)
    finally:
        stop(server)
        links.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
