"""Size a fleet by simulation: N sidecars' pages scraped by vmagent into VictoriaMetrics, vmalert on the rules.

    python bench/fleet.py                                  # N = 100, 1,000, 10,000 engines, 15 s scrapes
    python bench/fleet.py --engines 100 --minutes 4        # one size, shorter
    python bench/fleet.py --pages-only                     # what one engine exports, and the budget

One engine's pages are the agent's own output: the demo's simulated vLLM (with its simulated H100) and the
real agent, driven on a fake clock through 305 s of simulated time (every --windows window full, 10 s, 1 m
and 5 m), sampled every second like `rooflight demo` (engine, GPU and process), then rendered by the
agent's exposition; and the simulated vLLM's own /metrics, which the same deployment scrapes for the SLO
rules. A page server on 127.0.0.1 serves N copies, each with its own target, pod, namespace, cluster and
one of four model names; each second every counter advances by what the agent's last second added (times a
per-engine factor, so engines differ) and every gauge moves by up to 1%, so the store compresses values
that change, not a frozen page.

Per N, everything is started fresh here on loopback (Debian's victoria-metrics package: victoria-metrics,
vmagent, vmalert): vmagent scrapes the 2N targets (agent and engine of each pod) at --scrape and writes to
VictoriaMetrics; vmalert evaluates rules/rooflight-pod.rules.yaml and rules/rooflight-fleet.rules.yaml
every --eval (60 s), as the central ruler of agent-mode clusters does. After --minutes it reads:
- series in the store, per engine, by kind: the agent's, the engine's, the records the rules write;
- samples/s ingested (vm_rows_inserted_total) and VictoriaMetrics' CPU seconds per million samples;
- bytes on disk per sample after a forced flush, and so bytes a day per engine and per 1,000 GPUs;
- each rule group's evaluation time as vmalert measures it (vmalert_iteration_duration_seconds), and each
  fleet record's query timed alone against the store at the end (vmalert paused meanwhile).
Samples/s at 1 Hz and 15 s scrapes are the series per engine over the interval. The printed table is the
one docs/deploy.md (section Fleet) shows, with the machine it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
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
import urllib.parse
import urllib.request
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rooflight.agent.cli import resolve_models  # noqa: E402
from rooflight.agent.config.agent import build  # noqa: E402
from rooflight.agent.demo import DemoConfig, DemoEngine  # noqa: E402
from rooflight.agent.metrics.exposition import registry_for  # noqa: E402
from rooflight.agent.sampling.clock import FakeClock  # noqa: E402
from rooflight.agent.sampling.sampler import Agent  # noqa: E402
from rooflight.collectors.nvml import NvmlCollector  # noqa: E402
from rooflight.collectors.process import ProcessCollector  # noqa: E402

# What one engine's sidecar exports, one GPU, every window full (measured by this file's --pages-only:
# 239 series; docs/deploy.md, section Fleet), with room for a few families more. A change that adds series
# per engine past it fails tests/fleet/test_series_budget.py: raise it here on purpose, with the new cost
# per 1,000 GPUs in the docs.
SERIES_BUDGET = 260
FULL_S = 305  # simulated seconds: the longest default window (5 m) full, and then some
TARGET = "llm-0"  # the agent's target label in the captured page (the chart sets the pod's name)
MODELS = ("llama-3-8b", "llama-3-70b", "qwen-2.5-32b", "mistral-7b")
ENGINES_PER_CLUSTER = 500  # the simulated fleet's clusters: 20 at 10,000 engines
ENGINES_PER_NAMESPACE = 50


@dataclass(frozen=True)
class EnginePages:
    """One engine's agent page and its engine's own page, captured one simulated second apart."""

    agent: tuple[str, str]
    engine: tuple[str, str]


async def engine_pages(seconds: int = FULL_S, scenario: str = "steady", seed: int = 7) -> EnginePages:
    """The demo engine and the real agent on one fake clock, sampled every second for `seconds` (engine,
    GPU, process: what `rooflight demo` samples); the pages of the last two seconds."""
    from prometheus_client import generate_latest

    clock = FakeClock()
    engine = DemoEngine(DemoConfig(scenario=scenario, seed=seed), clock=clock)
    await engine.start()
    config = build({}, {}, {"engine_url": [engine.url], "interval": "1s", "batch_max": engine.sim.max_num_seqs,
                            "target_name": TARGET, "gpu_hour_cost": 2.5})
    agent = Agent(config, models=resolve_models(config), clock=clock, nvml_lib=engine.nvml,
                  process_pids={TARGET: os.getpid()})
    await agent.start(loops=False)
    gpus = NvmlCollector(lib=engine.nvml, clock=clock.monotonic)
    process = ProcessCollector(pid=os.getpid(), clock=clock.time, monotonic=clock.monotonic)
    agent_pages: list[str] = []
    engine_texts: list[str] = []
    try:
        for second in range(seconds):
            clock.advance(1.0)
            engine.tick()
            await agent.sample_engines_once()
            await agent.sample_gpus_once(gpus)
            await agent.sample_process_once(config.targets[0], process)
            if second >= seconds - 2:
                agent_pages.append(generate_latest(registry_for(lambda: agent.snapshot)).decode())
                engine_texts.append(engine.metrics_text())
    finally:
        gpus.close()
        await agent.stop()
        await engine.stop()
    return EnginePages((agent_pages[0], agent_pages[1]), (engine_texts[0], engine_texts[1]))


def series(page: str) -> list[str]:
    """The series of an exposition: every sample line's name and labels."""
    return [line.rsplit(" ", 1)[0] for line in page.splitlines() if line and not line.startswith("#")]


def families(page: str) -> dict[str, int]:
    """Series per metric name (a histogram's _bucket, _sum and _count apart)."""
    out: dict[str, int] = {}
    for s in series(page):
        name = s.split("{", 1)[0]
        out[name] = out.get(name, 0) + 1
    return out


# -- N engines' pages ---------------------------------------------------------------------------------
PLACEHOLDERS = ((f'target="{TARGET}"', 'target="@T@"'), ('model="llama-3-8b"', 'model="@M@"'),
                ('model_name="llama-3-8b"', 'model_name="@M@"'))
OFFSETS = 8  # engine i serves variant i % OFFSETS: its counters grow at its own pace, its gauges move apart
TARGETS_PER_JOB = 200  # at most: past it one scrape carries several engines' pages (see targets())
_TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


@dataclass(frozen=True)
class Line:
    prefix: str  # `name{@L@,labels} `: @L@ is where each engine's scrape labels go
    value: float  # in the later page
    step: float  # what a second added (counters), 0 for gauges
    moves: bool  # a gauge that is not 0/1 or a constant
    whole: bool  # a counter of whole things (tokens, requests): written as an integer

class Template:
    """A page whose values advance in time: counters by their last second's increase (x a per-variant
    factor), gauges by up to 1% either way."""

    def __init__(self, before: str, after: str) -> None:
        for old, new in PLACEHOLDERS:
            before, after = before.replace(old, new), after.replace(old, new)
        cumulative = {name for name, kind in _TYPE.findall(after) if kind in ("counter", "histogram", "summary")}
        previous = dict(line.rsplit(" ", 1) for line in before.splitlines() if line and not line.startswith("#"))
        self.lines = []
        for line in after.splitlines():
            if not line or line.startswith("#"):
                continue
            key, text = line.rsplit(" ", 1)
            value = float(text)
            name, brace, labels = key.partition("{")
            counter = any(name == c or (name.startswith(c) and name[len(c):] in ("_total", "_bucket", "_count", "_sum"))
                          for c in cumulative) and not name.endswith("_created")
            step = max(value - float(previous.get(key, value)), 0.0) if counter else 0.0
            moves = not counter and value not in (0.0, 1.0) and not name.endswith(("_info", "_created"))
            prefix = f"{name}{{@L@,{labels} " if brace else f"{name}{{@L@}} "
            self.lines.append(Line(prefix, value, step, moves, counter and value.is_integer() and step.is_integer()))

    def render(self, t: float, variant: int, rng: random.Random) -> bytes:
        factor = 0.8 + 0.4 * variant / (OFFSETS - 1)
        parts = []
        for line in self.lines:
            if line.step:
                value = line.value + line.step * factor * (t + 37 * variant)
                if line.whole:
                    value = float(int(value))
            elif line.moves:
                value = line.value * (1 + 0.01 * rng.uniform(-1, 1))
            else:
                value = line.value
            parts.append(f"{line.prefix}{value!r}")
        return ("\n".join(parts) + "\n").encode()


def scrape_labels(i: int, port: int) -> bytes:
    """Engine i's labels as a PodMonitor gives them: clusters of ENGINES_PER_CLUSTER, namespaces of
    ENGINES_PER_NAMESPACE, its pod and its pod's address."""
    return (f'cluster="c{i // ENGINES_PER_CLUSTER}",namespace="ns{(i // ENGINES_PER_NAMESPACE) % 10}",'
            f'pod="llm-{i}",instance="10.{i // 65536}.{(i // 256) % 256}.{i % 256}:{port}"').encode()


class PageServer:
    """Serves /a/<b> (the agents of batch b of engines) and /e/<b> (their engines) on 127.0.0.1 from an event
    loop on a thread of its own, so the measuring code may block; every page re-rendered each second."""

    def __init__(self, pages: EnginePages, engines: int, per_target: int) -> None:
        self.templates = {"a": Template(*pages.agent), "e": Template(*pages.engine)}
        self.engines, self.per_target = engines, per_target
        self.labels = {"a": [scrape_labels(i, 9746) for i in range(engines)],
                       "e": [scrape_labels(i, 8000) for i in range(engines)]}
        self.names = [(f"llm-{i}".encode(), MODELS[i % len(MODELS)].encode()) for i in range(engines)]
        self.rng = random.Random(49)
        self.started = time.monotonic()
        self.pages: dict[str, list[bytes]] = {}
        self._refresh()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="pages", daemon=True)

    def _refresh(self) -> None:
        t = time.monotonic() - self.started
        self.pages = {kind: [tpl.render(t, v, self.rng) for v in range(OFFSETS)] for kind, tpl in self.templates.items()}

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._refresh()

    async def _page(self, request: Any) -> Any:
        from aiohttp import web

        kind, batch = request.match_info["kind"], int(request.match_info["b"])
        pages, labels = self.pages[kind], self.labels[kind]
        first, last = batch * self.per_target, min((batch + 1) * self.per_target, self.engines)
        body = b"".join(pages[i % OFFSETS].replace(b"@L@", labels[i]).replace(b"@T@", self.names[i][0])
                        .replace(b"@M@", self.names[i][1]) for i in range(first, last))
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def _start(self) -> int:
        from aiohttp import web

        app = web.Application()
        app.router.add_get(r"/{kind:[ae]}/{b:\d+}", self._page)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        self.tick = asyncio.ensure_future(self._ticker())
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def _stop(self) -> None:
        self.tick.cancel()
        await self.runner.cleanup()

    def start(self) -> int:
        self.thread.start()
        return int(asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


# -- the store, its scraper and its ruler ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples on a /metrics page whose labels include `labels`."""
    total = 0.0
    for line in http(url).decode().splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in " {"):
            key, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                total += float(value)
    return total


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query(base: str, expr: str) -> tuple[list[dict[str, Any]], float]:
    """An instant query's result and how long it took (seconds). A 503 (the store's queue of queries full:
    vmalert's own keep it busy) is waited out and asked again, its wait not counted."""
    import urllib.error

    for attempt in range(10):
        start = time.perf_counter()
        try:
            body = json.loads(http(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=300))
            break
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or attempt == 9:
                raise
            time.sleep(5)
    took = time.perf_counter() - start
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"], took


class Server:
    """A binary on a free 127.0.0.1 port, in its own directory, stopped by its PID."""

    def __init__(self, root: Path, name: str, argv: list[str], ready: str = "/health") -> None:
        self.dir = root / name
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [a.replace("{dir}", str(self.dir)).replace("{port}", str(self.port)) for a in argv]
        with open(self.dir / "log", "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                http(self.url + ready, timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start: {(self.dir / 'log').read_text()[-2000:]}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def targets(n: int, per_target: int, port: int, scrape: str) -> dict[str, Any]:
    """vmagent's scrape config: the agents (job rooflight) and the engines (job vllm), `per_target` engines
    a scrape. Each page carries its engines' cluster, namespace, pod and instance (honor_labels), as one
    scrape per pod would give them, so the store holds the same series either way; only `up` and the
    scrape_* series come per target, not per engine."""
    batches = range((n + per_target - 1) // per_target)
    return {"global": {"scrape_interval": scrape, "scrape_timeout": scrape},
            "scrape_configs": [{"job_name": job, "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{port}"], "labels": {"__metrics_path__": f"/{kind}/{b}"}} for b in batches]}
                for job, kind in (("rooflight", "a"), ("vllm", "e"))]}


@dataclass
class Sized:
    """What one N measured."""

    engines: int
    per_target: int  # engines a scrape carries
    scrape_s: float
    series: dict[str, float]  # kind -> series in the store: agent, engine, records
    samples_per_s: float  # ingested, mean over the measured minutes
    rig_cpu: dict[str, float]  # process -> share of one core over the measured minutes (the store's
    # includes answering vmalert's queries)
    scrapes_failed: float  # share of vmagent's scrapes that failed
    value_bytes_per_sample: float
    index_bytes_per_series: float
    group_eval_s: dict[str, float]  # vmalert group -> mean evaluation time over the measured minutes
    slowest_fleet_query: tuple[str, float]
    missed: float  # vmalert evaluations skipped because the previous one overran the interval


def rules_files() -> list[Path]:
    return [ROOT / "rules" / "rooflight-pod.rules.yaml", ROOT / "rules" / "rooflight-fleet.rules.yaml"]


def fleet_records() -> list[str]:
    import yaml

    doc = yaml.safe_load(rules_files()[1].read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r]


class DidNotFit(RuntimeError):
    """A rig process outgrew the memory it may take on this machine."""


def rss_bytes(pid: int) -> float:
    return float(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _wait(seconds: float, procs: dict[str, int], max_rss: float) -> None:
    """Sleep `seconds`, checking every 5 s that no process of the rig outgrew `max_rss` bytes (on a shared
    machine a store that cannot keep up grows until the kernel kills something)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(5.0, left))
        for name, pid in procs.items():
            if (rss := rss_bytes(pid)) > max_rss:
                raise DidNotFit(f"{name} reached {rss / 2**30:.1f} GiB of memory (the limit: {max_rss / 2**30:.1f})")


def size(n: int, scrape_s: float, minutes: float, eval_s: float, pages: EnginePages, max_rss: float) -> Sized:
    """One fleet of `n` engines, fresh: warm up for a minute (every series is new then), measure the rest."""
    import yaml

    root = Path(tempfile.mkdtemp(prefix=f"rooflight-fleet-bench-{n}-"))
    per_target = max(1, -(-n // TARGETS_PER_JOB))
    server = PageServer(pages, n, per_target)
    port = server.start()
    started: list[Server] = []
    try:
        # -search.maxUniqueTimeseries: the series counts below match every engine's series at once (its
        # default, 300,000, refuses counting 1,000 engines' vLLM series); no rule comes near it
        vm = Server(root, "victoria-metrics", ["victoria-metrics", "-storageDataPath={dir}/data",
                                               "-httpListenAddr=127.0.0.1:{port}", "-search.maxUniqueTimeseries=100000000",
                                               "-loggerLevel=WARN"])
        started.append(vm)
        config = root / "scrape.yml"
        config.write_text(yaml.safe_dump(targets(n, per_target, port, f"{scrape_s:g}s")))
        vmagent = Server(root, "vmagent", ["vmagent", f"-promscrape.config={config}", f"-remoteWrite.url={vm.url}/api/v1/write",
                                           "-remoteWrite.tmpDataPath={dir}/queue", "-httpListenAddr=127.0.0.1:{port}",
                                           "-promscrape.maxScrapeSize=1GB", "-loggerLevel=WARN"])
        started.append(vmagent)
        # vmalert will not load alerting rules without somewhere to send them (1.79 has no blackhole)
        am = root / "alertmanager.yml"
        am.write_text(yaml.safe_dump({"route": {"receiver": "null"}, "receivers": [{"name": "null"}]}))
        alertmanager = Server(root, "alertmanager", ["prometheus-alertmanager", f"--config.file={am}",
                                                     "--storage.path={dir}", "--web.listen-address=127.0.0.1:{port}",
                                                     "--cluster.listen-address=", "--log.level=warn"], "/-/ready")
        started.append(alertmanager)
        vmalert = Server(root, "vmalert", ["vmalert", *(f"-rule={f}" for f in rules_files()), f"-datasource.url={vm.url}",
                                           f"-remoteWrite.url={vm.url}", f"-notifier.url={alertmanager.url}",
                                           f"-evaluationInterval={eval_s:g}s", "-httpListenAddr=127.0.0.1:{port}",
                                           "-loggerLevel=ERROR"])
        started.append(vmalert)
        procs = {"victoria-metrics": vm.proc.pid, "vmagent": vmagent.proc.pid, "vmalert": vmalert.proc.pid,
                 "page server (this process)": os.getpid()}
        watch = {name: pid for name, pid in procs.items() if pid != os.getpid()}
        _wait(60, watch, max_rss)
        before = _counters(vm, vmagent, vmalert)
        cpu0 = {name: cpu_seconds(pid) for name, pid in procs.items()}
        t0 = time.monotonic()
        _wait(max(minutes * 60 - 60, 60), watch, max_rss)
        took = time.monotonic() - t0
        after = _counters(vm, vmagent, vmalert)
        cpu = {name: (cpu_seconds(pid) - cpu0[name]) / took for name, pid in procs.items()}
        group_eval = {g: (after[("sum", g)] - before.get(("sum", g), 0)) / (after[("count", g)] - before.get(("count", g), 0))
                      for kind, g in after if kind == "count" and after[("count", g)] > before.get(("count", g), 0)}
        # each fleet record's query alone: vmalert paused, so the store answers nothing else meanwhile
        vmalert.proc.send_signal(signal.SIGSTOP)
        try:
            timed = [(query(vm.url, expr)[1], expr) for expr in fleet_records()]
        finally:
            vmalert.proc.send_signal(signal.SIGCONT)
        series = series_by_kind(vm.url)
        # Flush, then merge this month's parts as a day of data would be merged: bytes per sample of the few
        # minutes' small parts alone would overstate a day's several times.
        http(f"{vm.url}/internal/force_flush")
        http(f"{vm.url}/internal/force_merge?partition_prefix={time.strftime('%Y_%m', time.gmtime())}")
        sizes = [-1.0]
        for _ in range(90):
            time.sleep(2)
            sizes.append(metric(f"{vm.url}/metrics", "vm_data_size_bytes"))
            if sizes[-1] == sizes[-2] and not metric(f"{vm.url}/metrics", "vm_active_merges"):
                break
        values = metric(f"{vm.url}/metrics", "vm_data_size_bytes", type="storage/small") + \
            metric(f"{vm.url}/metrics", "vm_data_size_bytes", type="storage/big")
        index = metric(f"{vm.url}/metrics", "vm_data_size_bytes", type="indexdb")
        total_rows = metric(f"{vm.url}/metrics", "vm_rows_inserted_total")
        slow_s, slow_expr = max(timed)
        return Sized(n, per_target, scrape_s, series, (after[("rows", "")] - before[("rows", "")]) / took, cpu,
                     (after[("failed", "")] - before[("failed", "")]) / max(after[("scrapes", "")] - before[("scrapes", "")], 1),
                     values / max(total_rows, 1), index / max(sum(series.values()), 1), group_eval,
                     (" ".join(slow_expr.split()), slow_s), after[("missed", "")] - before[("missed", "")])
    finally:
        for s in reversed(started):
            s.stop()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def series_by_kind(base: str) -> dict[str, float]:
    """The store's series today by kind, from its per-name counts (no query matches them all): the agent's
    (rooflight_*), the engine's (vLLM's names have one colon), the records (level:metric:operations, two).
    vmagent's up and scrape_* (6 a scrape target) and vmalert's ALERTS are left out."""
    body = json.loads(http(f"{base}/api/v1/status/tsdb?topN=100000"))
    out = {"agent": 0.0, "engine": 0.0, "records": 0.0}
    for row in body["data"]["seriesCountByMetricName"]:
        name, count = row["name"], float(row["value"])
        kind = {2: "records", 1: "engine"}.get(name.count(":"), "agent" if name.startswith("rooflight_") else "")
        if kind:
            out[kind] += count
    return out


def _counters(vm: Server, vmagent: Server, vmalert: Server) -> dict[tuple[str, str], float]:
    """The cumulative counters the measurement is the difference of."""
    out = {("rows", ""): metric(f"{vm.url}/metrics", "vm_rows_inserted_total"),
           ("scrapes", ""): metric(f"{vmagent.url}/metrics", "vm_promscrape_scrapes_total"),
           ("failed", ""): metric(f"{vmagent.url}/metrics", "vm_promscrape_scrapes_failed_total"),
           ("missed", ""): metric(f"{vmalert.url}/metrics", "vmalert_iteration_missed_total")}
    for line in http(f"{vmalert.url}/metrics").decode().splitlines():
        m = re.match(r'vmalert_iteration_duration_seconds_(sum|count)\{.*group="([^"]+)".*\} (\S+)', line)
        if m:
            out[(m.group(1), m.group(2))] = out.get((m.group(1), m.group(2)), 0.0) + float(m.group(3))
    return out


# -- the report ---------------------------------------------------------------------------------------


def per_gpu_series(page: str) -> int:
    return sum(1 for s in series(page) if 'gpu="' in s)


def report_pages(pages: EnginePages) -> None:
    agent, engine = series(pages.agent[1]), series(pages.engine[1])
    print(f"one engine (1 GPU, every window full): agent {len(agent)} series (budget {SERIES_BUDGET}; "
          f"{per_gpu_series(pages.agent[1])} of them per GPU), its engine's own page {len(engine)}; "
          f"pages {len(pages.agent[1]) / 1024:.1f} KiB and {len(pages.engine[1]) / 1024:.1f} KiB")
    for interval in (1, 15):
        print(f"  scraped every {interval:>2} s: {(len(agent) + len(engine)) / interval:8.1f} samples/s per engine "
              f"({len(agent) / interval:.1f} of them the agent's)")


def report(sized: list[Sized]) -> None:
    print("\n| engines | engines a scrape | series per engine: agent + engine + records | samples/s ingested | "
          "store CPU | failed scrapes | pod half, one evaluation | fleet half, one evaluation | missed evaluations |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in sized:
        per = {k: v / s.engines for k, v in s.series.items()}
        pod = sum(v for g, v in s.group_eval_s.items() if "-fleet" not in g)
        fleet = sum(v for g, v in s.group_eval_s.items() if "-fleet" in g)
        print(f"| {s.engines:,} | {s.per_target} | {per['agent']:.0f} + {per['engine']:.0f} + {per['records']:.1f} "
              f"| {s.samples_per_s:,.0f} | {100 * s.rig_cpu['victoria-metrics']:.0f}% of a core | "
              f"{100 * s.scrapes_failed:.2f}% | {1000 * pod:,.0f} ms | {1000 * fleet:,.0f} ms | {s.missed:.0f} |")
    for s in sized:
        per_engine = (s.series["agent"] + s.series["engine"] + s.series["records"]) / s.engines
        day = 86400 / s.scrape_s
        value_bytes = per_engine * day * s.value_bytes_per_sample
        index_bytes = per_engine * s.index_bytes_per_series
        print(f"N={s.engines:,} at {s.scrape_s:g} s: per 1,000 GPUs (one an engine) {1000 * per_engine:,.0f} series, "
              f"{1000 * per_engine * day / 1e6:,.0f} M samples a day, {1000 * (value_bytes + index_bytes) / 2**30:.2f} GiB "
              f"a day on disk ({s.value_bytes_per_sample:.2f} B a sample merged, {s.index_bytes_per_series:.0f} B of index "
              f"a series); rig CPU (share of one core): "
              + ", ".join(f"{k} {100 * v:.0f}%" for k, v in s.rig_cpu.items()))
        print(f"  slowest fleet record alone: {1000 * s.slowest_fleet_query[1]:.0f} ms ({s.slowest_fleet_query[0][:160]}); "
              "groups: " + ", ".join(f"{g} {1000 * v:.0f} ms" for g, v in sorted(s.group_eval_s.items())))


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    load = os.getloadavg()
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"], capture_output=True,
                             text=True).stdout.strip()
    return (f"{os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}, load average {load[0]:.1f} at "
            f"the end; Debian victoria-metrics {version or '(version unknown)'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="100,1000,10000", help="comma list of fleet sizes (default %(default)s)")
    parser.add_argument("--scrape", type=float, default=15.0, help="vmagent's scrape interval, seconds")
    parser.add_argument("--eval", type=float, default=60.0, help="vmalert's evaluation interval, seconds")
    parser.add_argument("--minutes", type=float, default=8.0,
                        help="per size: one minute of warm-up, then the rest measured; 6 or more fills the 5 m windows")
    parser.add_argument("--pages-only", action="store_true", help="only what one engine exports")
    parser.add_argument("--max-rss-gib", type=float, default=0.0,
                        help="stop a size when one of its servers passes this much memory (default: a third of the machine's)")
    args = parser.parse_args(argv)
    missing = [b for b in ("victoria-metrics", "vmagent", "vmalert", "prometheus-alertmanager") if not shutil.which(b)]
    pages = asyncio.run(engine_pages())
    report_pages(pages)
    if args.pages_only:
        return 0
    if missing:
        print(f"not installed: {', '.join(missing)} (apt-get install victoria-metrics prometheus-alertmanager)",
              file=sys.stderr)
        return 2
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    max_rss = args.max_rss_gib * 2**30 or total / 3
    sized, unfit = [], []
    for n in (int(x) for x in args.engines.split(",")):
        try:
            sized.append(size(n, args.scrape, args.minutes, args.eval, pages, max_rss))
        except DidNotFit as exc:
            unfit.append(f"N={n:,} did not fit this machine: {exc}; stopped")
            print(unfit[-1], flush=True)
            continue
        report(sized[-1:])
    print(f"\nmachine: {machine()}")
    print(f"command: python bench/fleet.py --engines {args.engines} --scrape {args.scrape:g} --eval {args.eval:g} "
          f"--minutes {args.minutes:g}")
    report(sized)
    print("\n".join(unfit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
