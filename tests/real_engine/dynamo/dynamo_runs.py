"""The Dynamo deployments of the real-engine stage, each run once and observed from every side.

Owns the choreography (as tests/real_engine/setups.py does for vLLM): start the frontend and the
mocker workers (one process each), a real Prometheus scraping the frontend and the workers, and the
agent given only their URLs; let the agent see an idle baseline; drive bounded streaming load
(bench/loadgen.py) through the frontend while polling every page; then read everything at one quiet
moment. The tests only assert on the returned DynamoRun.

The agent's window is 30 s (`--windows 30s`, interval 0.5 s): read ~31 s after the agent started, it
begins before the load and ends after it, so inside it every counter's increase is the whole load's.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.loadgen import LoadReport, LoadSpec, run_load
from dynamo_deploy import MODEL, READY_TIMEOUT_S, frontend_process, mocker_process, system_port
from procs import ManagedProcess, agent_process, free_port, http_text
from promserver import prometheus_process, scalar, scraped_after, wait_for_samples
from scrape import Poller, Samples, parse, select, total

WINDOW = "30s"
WINDOW_S = 30.0
SHORT_WINDOW = "10s"  # the saturation checks: a window inside the load
BASELINE_S = 4.0
AGENT_READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Worker:
    name: str  # page key: "worker", "prefill", "decode"
    flags: tuple[str, ...]
    role: str | None = None  # the agent's `role` setting for this target (a config file's targets entry)
    batch_max: int | None = None  # the agent's `batch_max` (the mocker's vllm:* page does not carry it)


@dataclass(frozen=True)
class Deployment:
    name: str
    workers: tuple[Worker, ...]
    load: dict
    router_mode: str = "round-robin"
    agent_flags: tuple[str, ...] = ()
    proxy: bool = False  # the load goes through `rooflight proxy` (its own process) in front of the frontend


# The mocker's pool: 128 blocks of 16 tokens (2,048 tokens), so 6 requests of ~60 + 160 tokens fill
# two thirds of it; --max-num-seqs 8 is the batch cap the frontend publishes.
POOL = ("--num-gpu-blocks-override", "128", "--block-size", "16", "--max-num-seqs", "8")
AGGREGATED = Deployment(
    "agg", (Worker("worker", POOL),),
    dict(requests=18, concurrency=6, max_tokens=160, prompt_words=40, chat_every=3, model=MODEL),
    proxy=True,
)
# Prefill pool roomy, decode pool capped at 2 sequences: 8 concurrent long generations queue at the
# decode worker while the prefill worker finishes each 40-word prompt in one step and idles.
DISAGGREGATED = Deployment(
    "disagg",
    (Worker("prefill", ("--disaggregation-mode", "prefill", *POOL)),  # its page says prefill (component)
     Worker("decode", ("--disaggregation-mode", "decode", "--num-gpu-blocks-override", "256", "--block-size", "16",
                       "--max-num-seqs", "2"), role="decode", batch_max=2)),
    dict(requests=16, concurrency=8, max_tokens=200, prompt_words=40, model=MODEL),
    router_mode="kv",
)
@dataclass
class DynamoRun:
    deployment: Deployment
    ports: dict[str, int]  # "frontend", each worker's name, "agent", "prometheus", "proxy"
    load: LoadReport
    before: dict[str, Samples]  # every Dynamo page just before the load
    after: dict[str, Samples]  # every Dynamo page at read_time (quiet)
    raw_after: dict[str, str]  # the same pages as text (fixture capture)
    raw_during: dict[str, str]  # each page once in the middle of the load
    agent_after: Samples
    read_time: float
    agent_started: float
    agent_pages: list[tuple[float, Samples]] = field(default_factory=list)
    pages: dict[str, list[tuple[float, Samples]]] = field(default_factory=dict)  # polled during the run
    prom_queries: dict[str, float | None] = field(default_factory=dict)
    proxy_before: Samples = field(default_factory=dict)  # `rooflight proxy`'s /metrics just before the load
    proxy_after: Samples = field(default_factory=dict)  # ... at read_time
    plan: dict = field(default_factory=dict)  # `rooflight plan --from-live AGENT --rate R --json` at read_time
    sustained_rate: float = 0.0  # requests/s the deployment served over the load
    processes: list[ManagedProcess] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def target(self, page: str) -> str:
        """The agent's `target` label for a page (host:port, its default)."""
        return f"127.0.0.1:{self.ports[page]}"

    def url(self, page: str) -> str:
        return f"http://127.0.0.1:{self.ports[page]}/metrics"


def _wait_model(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if f'"{MODEL}"' in http_text(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the frontend never listed model {MODEL!r}")


def _wait_engines_up(agent_port: int, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = parse(http_text(f"http://127.0.0.1:{agent_port}/metrics"))
        up = [v for (n, ls), v in s.items() if n == "rooflight_source_up" and ("source", "engine") in ls]
        if len(up) >= count and all(v == 1.0 for v in up):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the agent never reported {count} engines up")


def run_deployment(python: str, model_dir: Path, run_dir: Path, dep: Deployment,
                   started: list[ManagedProcess]) -> DynamoRun:
    """Run one deployment; every process started is appended to `started` (the caller stops them)."""
    base = run_dir / f"dynamo-{dep.name}"
    timings: dict[str, float] = {}
    t = time.monotonic()
    ports = {"frontend": free_port()}
    frontend = frontend_process(python, base, ports["frontend"], dep.router_mode)
    started.append(frontend.start())
    procs = [frontend]
    for w in dep.workers:
        ports[w.name] = system_port()
        proc = mocker_process(python, model_dir, base, w.name, ports[w.name], w.flags)
        started.append(proc.start())
        procs.append(proc)
    frontend.wait_http(f"http://127.0.0.1:{ports['frontend']}/health", READY_TIMEOUT_S)
    for proc, w in zip(procs[1:], dep.workers):
        proc.wait_http(f"http://127.0.0.1:{ports[w.name]}/metrics", READY_TIMEOUT_S)
    _wait_model(ports["frontend"], READY_TIMEOUT_S)
    time.sleep(2.0)  # every worker registered (the model is listed at the first)
    # The frontend creates its request counters and histograms at a model's first request; a window
    # starting before that has no first value to take a rate from (as Prometheus's rate() would not).
    asyncio.run(run_load(LoadSpec(url=f"http://127.0.0.1:{ports['frontend']}", requests=len(dep.workers),
                                  concurrency=1, max_tokens=4, prompt_words=8, model=MODEL)))
    timings["dynamo_ready_s"] = time.monotonic() - t

    pages = ["frontend", *(w.name for w in dep.workers)]
    prom = prometheus_process(base, dep.name, {p: f"127.0.0.1:{ports[p]}" for p in pages})
    started.append(prom.start())
    procs.append(prom)
    ports["prometheus"] = prom.port

    t = time.monotonic()
    ports["agent"] = free_port()
    extra = [a for w in dep.workers if w.role is None for a in ("--engine-url", f"http://127.0.0.1:{ports[w.name]}")]
    roles = [w for w in dep.workers if w.role is not None]
    if roles:
        config = base / "agent.yaml"
        config.write_text("targets:\n" + "".join(
            f"  - {{url: 'http://127.0.0.1:{ports[w.name]}', role: {w.role}"
            + (f", batch_max: {w.batch_max}" if w.batch_max else "") + "}\n" for w in roles))
        extra += ["--config", str(config)]
    extra += ["--windows", f"{SHORT_WINDOW},{WINDOW}", *dep.agent_flags]
    agent = agent_process(ports["frontend"], model_dir, base, dep.name, ports["agent"], extra=tuple(extra))
    started.append(agent.start())
    procs.append(agent)
    if dep.proxy:
        ports["proxy"], ports["proxy_metrics"] = free_port(), free_port()
        proxy = proxy_process(ports["frontend"], base, ports["proxy"], ports["proxy_metrics"])
        started.append(proxy.start())
        procs.append(proxy)
        proxy.wait_http(f"http://127.0.0.1:{ports['proxy_metrics']}/metrics", AGENT_READY_TIMEOUT_S)
    agent.wait_http(f"http://127.0.0.1:{ports['agent']}/metrics", AGENT_READY_TIMEOUT_S)
    _wait_engines_up(ports["agent"], len(pages))
    agent_started = time.time()
    prom.wait_http(f"http://127.0.0.1:{prom.port}/-/ready", 30)
    wait_for_samples(prom.port, "dynamo_frontend_time_to_first_token_seconds_count")
    prom_ready = time.time()
    timings["agent_and_prometheus_ready_s"] = time.monotonic() - t

    agent_poll = Poller(f"http://127.0.0.1:{ports['agent']}/metrics").start()
    polls = {p: Poller(f"http://127.0.0.1:{ports[p]}/metrics").start() for p in pages}
    # The Prometheus checks read the buckets 0.5 s before the load: at least two scrapes in by then.
    time.sleep(max(0.0, agent_started + BASELINE_S - time.time(), prom_ready + 2.5 - time.time()))
    before = {p: parse(http_text(f"http://127.0.0.1:{ports[p]}/metrics")) for p in pages}
    proxy_page = f"http://127.0.0.1:{ports.get('proxy_metrics')}/metrics"
    proxy_before = parse(http_text(proxy_page)) if dep.proxy else {}

    t = time.monotonic()
    load_url = f"http://127.0.0.1:{ports['proxy' if dep.proxy else 'frontend']}"
    raw_during: dict[str, str] = {}

    async def load_and_capture() -> LoadReport:
        task = asyncio.create_task(run_load(LoadSpec(url=load_url, **dep.load)))
        await asyncio.sleep(2.0)
        for p in pages:
            raw_during[p] = await asyncio.to_thread(http_text, f"http://127.0.0.1:{ports[p]}/metrics")
        return await task

    report = asyncio.run(load_and_capture())
    timings["load_s"] = time.monotonic() - t

    quiet_at = max(report.ended + 3.0, agent_started + WINDOW_S + 1.0)
    assert report.started > quiet_at - WINDOW_S + 1.0, "the load started outside the agent's window"
    time.sleep(max(0.0, quiet_at - time.time()))
    # then on, while the window still holds the load's start, until the agent has the frontend's last counts: a
    # host stall past the 3 s (CI has seen 15 s) must not leave the read a sample behind
    while time.time() < report.started + WINDOW_S - 1.0 and not _caught_up(ports, prom.port, report.ended):
        time.sleep(0.5)
    read_time = time.time()
    agent_after = parse(http_text(f"http://127.0.0.1:{ports['agent']}/metrics"))
    sustained = len(report.ok) / max(1e-9, report.ended - report.started)
    plan = _plan(ports["agent"], sustained)
    raw_after = {p: http_text(f"http://127.0.0.1:{ports[p]}/metrics") for p in pages}
    proxy_after = parse(http_text(proxy_page)) if dep.proxy else {}
    run = DynamoRun(
        deployment=dep, ports=ports, load=report, before=before,
        after={p: parse(text) for p, text in raw_after.items()}, raw_after=raw_after, raw_during=raw_during,
        agent_after=agent_after, read_time=read_time, agent_started=agent_started,
        agent_pages=agent_poll.stop(), pages={p: poll.stop() for p, poll in polls.items()},
        processes=procs, timings=timings, proxy_before=proxy_before, proxy_after=proxy_after,
        plan=plan, sustained_rate=sustained,
    )
    _capture(run)
    _frontend_quantiles(run)
    return run


def _caught_up(ports: dict[str, int], prom_port: int, ended: float) -> bool:
    """Whether the agent's generated tokens for the frontend equal the frontend's own count, and Prometheus
    scraped the frontend after the load ended."""
    agent = parse(http_text(f"http://127.0.0.1:{ports['agent']}/metrics"))
    frontend = parse(http_text(f"http://127.0.0.1:{ports['frontend']}/metrics"))
    ours = select(agent, "rooflight_generation_tokens_total", target=f"127.0.0.1:{ports['frontend']}")
    if ours != [total(frontend, "dynamo_frontend_output_tokens_total")]:
        return False
    return scraped_after(prom_port, "dynamo_frontend_output_tokens_total", ended)


def _plan(agent_port: int, rate: float) -> dict:
    """`rooflight plan --from-live` on the agent's 30 s window: its pool sizing for the rate served."""
    out = subprocess.run(
        [sys.executable, "-m", "rooflight", "plan", "--from-live", f"http://127.0.0.1:{agent_port}",
         "--window", WINDOW, "--rate", f"{rate:.4f}", "--json"],
        capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items()
                                                          if not k.startswith("ROOFLIGHT_")})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


PROXY_SLO = "ttft=0.5,tpot=0.05"


def proxy_process(upstream_port: int, run_dir: Path, port: int, metrics_port: int) -> ManagedProcess:
    """`rooflight proxy` (this interpreter's install) in front of the frontend."""
    argv = [sys.executable, "-m", "rooflight", "proxy", "--upstream", f"http://127.0.0.1:{upstream_port}",
            "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
            "--slo", PROXY_SLO, "--log-level", "warning"]
    return ManagedProcess(name="proxy", argv=argv, log_path=run_dir / f"proxy-{port}.log", port=port,
                          env_drop_prefixes=("ROOFLIGHT_",))


def _capture(run: DynamoRun) -> None:
    """With ROOFLIGHT_DYNAMO_CAPTURE_DIR set, keep each page read mid-load as <deployment>-<page>.prom:
    how tests/fixtures/engine-samples/dynamo-1.6.1-*.prom were recorded (their README)."""
    out = os.environ.get("ROOFLIGHT_DYNAMO_CAPTURE_DIR")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    for page, text in run.raw_during.items():
        (Path(out) / f"{run.deployment.name}-{page}.prom").write_text(text)


FRONTEND_HISTOGRAMS = {"ttft": "dynamo_frontend_time_to_first_token_seconds",
                       "itl": "dynamo_frontend_inter_token_latency_seconds"}
PERCENTILES = ("50", "90", "99")


def _frontend_quantiles(run: DynamoRun) -> None:
    """histogram_quantile by the real Prometheus over the frontend's bucket deltas of the load (the
    buckets at the quiet read minus those just before the load; both quiet moments)."""
    before = run.load.started - 0.5
    for key, metric in FRONTEND_HISTOGRAMS.items():
        for p in PERCENTILES:
            # last_over_time: the value at `before` even if one 1 s scrape missed it on the busy cores.
            expr = (f'histogram_quantile({int(p) / 100}, sum by (le) ({metric}_bucket{{job="frontend"}})'
                    f' - sum by (le) (last_over_time({metric}_bucket{{job="frontend"}}[15s] @ {before:.3f})))')
            run.prom_queries[f"{key}:{p}"] = scalar(run.ports["prometheus"], expr, at=run.read_time)
