"""The proxy against the proxies people already put between clients and an engine, side by side in one run.

The same fake OpenAI SSE upstream and client as bench/bench_proxy.py (every chunk carries its send time),
through each peer in turn: nginx and haproxy (Debian packages: installed with apt-get when missing and
`--install`), vllm-router and the LiteLLM proxy (PyPI: each in a venv of its own under `--cache`, made with
`--install`), and `rooflight proxy` with one worker and with two. A peer that cannot be installed or started
is reported as such, never faked. Each peer is pinned to `--proxy-cpu` (all its processes and threads: the
command runs under taskset), the upstream and the client to the other cores. Per scenario (STREAMS x
CHUNKS/S per stream) and round, the paths (direct and every peer) run in an order shuffled by `--seed`,
each for `--seconds`, every phase with the same stream start offsets. Per path:

- the proxy's CPU per chunk delivered: user + system time of all its processes (from /proc, via psutil)
  over the phase, divided by the chunks the client read; its RSS after the phase (and per process);
- added TTFT and ITL, p50 and p99: the path's percentile minus the direct path's in the same round (the
  median over the rounds is printed); throughput: its chunks/s over the direct path's, same round;
- what the peer's own metrics say about the same phase: rooflight's TTFT and ITL percentiles (its 3 s
  window, read after the phase), vllm-router's request duration histogram, LiteLLM's TTFT histogram,
  haproxy's average response time; nginx exports none.

A phase ends `--seconds` after it starts plus a grace of `--seconds` (a peer that falls behind has its
streams cut there, and is judged by what it delivered). Targets (docs/proxy.md, "Against the proxies people
run") are checked and printed as met or not, never asserted.

Run from the repository root (about 8 minutes for the three scenarios, 3 rounds, 4 s phases):
    python bench/bench_peers.py --install --scenarios 64x100,64x1000,256x200 --rounds 3 --seconds 4 --proxy-cpu 1
    python bench/bench_peers.py --peers nginx,rooflight-1,rooflight-2 --scenarios 64x100   # a few peers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from bench_proxy import Path_, _cpu, _free_port, _q, _wait_listening, one_stream, upstream_main  # noqa: E402

PEERS = ("nginx", "haproxy", "vllm-router", "litellm", "rooflight-1", "rooflight-2")
VLLM_ROUTER = "vllm-router==0.1.17"
LITELLM = ("litellm[proxy]==1.108.7", "prometheus_client")  # (its prometheus callback needs the client library)
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rooflight" / "bench-peers"


# -- the peers -------------------------------------------------------------------------------------------------


@dataclass
class Peer:
    """One proxy: how to start it in front of the upstream on `port`, and what its own metrics say."""

    name: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    metrics_url: str = ""
    read_own: Callable[[str, "Peer"], dict[str, float]] | None = None
    proc: subprocess.Popen[bytes] | None = None
    ps: psutil.Process | None = None
    unavailable: str = ""  # why it was not run
    before: dict[str, float] = field(default_factory=dict)  # its own metrics before a phase (histogram counts)

    def processes(self) -> list[psutil.Process]:
        if self.ps is None:
            return []
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def _apt(package: str, binary: str, install: bool) -> str:
    """The binary's path, installing its Debian package first when asked; '' when it cannot be had."""
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else "")
    if found or not install:
        return found
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=False, capture_output=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else "")


def _venv(cache: Path, name: str, packages: tuple[str, ...], binary: str, install: bool) -> tuple[str, str]:
    """(the venv's `binary`, its version or why there is none), made with pip under `cache` when asked."""
    venv = cache / name
    exe = venv / "bin" / binary
    if not exe.exists() and install:
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False, capture_output=True)
        done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages], capture_output=True, text=True)
        if done.returncode:
            return "", f"pip install {' '.join(packages)} failed: {done.stderr.strip().splitlines()[-1:]}"
    if not exe.exists():
        return "", f"not installed (run with --install, or pip install {' '.join(packages)} into {venv})"
    show = subprocess.run([str(venv / "bin" / "pip"), "show", packages[0].split("[")[0].split("=")[0]],
                          capture_output=True, text=True).stdout
    version = next((ln.split(":", 1)[1].strip() for ln in show.splitlines() if ln.startswith("Version:")), "?")
    return str(exe), version


def _histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over (le, cumulative count) pairs of one phase."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    rank, prev_le, prev_n = q * buckets[-1][1], 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / (n - prev_n) if n > prev_n else 0.0)
        prev_le, prev_n = le, n
    return prev_le


def _scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return []
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def _histogram_delta(peer: Peer, name: str) -> dict[str, float]:
    """This phase's p50 and p99 of the histogram `name` (summed over its other labels) from its counts' increase."""
    now: dict[float, float] = {}
    for sample, labels, value in _scrape(peer.metrics_url):
        if sample == name + "_bucket":
            le = float(labels["le"])
            now[le] = now.get(le, 0.0) + value
    key = f"_hist_{name}"
    before = json.loads(peer.before.get(key, "{}")) if isinstance(peer.before.get(key), str) else {}
    delta = [(le, n - float(before.get(str(le), 0.0))) for le, n in now.items()]
    peer.before[key] = json.dumps({str(k): v for k, v in now.items()})  # type: ignore[assignment]
    if not delta:
        return {}
    return {f"{name} p50": _histogram_quantile(0.5, delta), f"{name} p99": _histogram_quantile(0.99, delta),
            f"{name} count": max(n for _, n in delta)}


def _own_rooflight(_: str, peer: Peer) -> dict[str, float]:
    out = {}
    for name, labels, value in _scrape(peer.metrics_url):
        if labels.get("window") == "3s" and name in ("rooflight_client_ttft_seconds", "rooflight_client_itl_seconds"):
            out[f"{name.split('_')[2].upper()} p{labels['percentile']}"] = value
    return out


def _own_vllm_router(_: str, peer: Peer) -> dict[str, float]:
    # its only latency: the request's duration to the response headers (not the stream, no tokens)
    return _histogram_delta(peer, "vllm_router_generate_duration_seconds")


def _own_litellm(_: str, peer: Peer) -> dict[str, float]:
    out = _histogram_delta(peer, "litellm_llm_api_time_to_first_token_metric")
    return out or {"(no TTFT histogram read)": float("nan")}


def _own_haproxy(_: str, peer: Peer) -> dict[str, float]:
    out = {}
    for name, labels, value in _scrape(peer.metrics_url):
        if labels.get("proxy") == "be" and name in ("haproxy_backend_response_time_average_seconds",
                                                     "haproxy_backend_total_time_average_seconds"):
            out[name.replace("haproxy_backend_", "")] = value  # averages over its last 1,024 requests
    return out


def _quiesce(procs: list[psutil.Process], within: float = 120.0) -> float:
    """Wait until `procs` use under 5% of a core over 0.5 s (the next phase must not share the pinned core
    with this one's backlog: LiteLLM at 64 x 100/s worked on for seconds after its streams were cut);
    returns how long it took."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        before = _cpu(procs)
        time.sleep(0.5)
        if _cpu(procs) - before < 0.025:
            break
    return time.monotonic() - start


def _switches(procs: list[psutil.Process]) -> int:
    """Context switches (voluntary and not) of `procs` so far: a wake-up each, roughly."""
    total = 0
    for p in procs:
        try:
            total += sum(p.num_ctx_switches())
            total += sum(sum(t) for t in _thread_switches(p))
        except psutil.NoSuchProcess:
            pass
    return total


def _thread_switches(p: psutil.Process) -> list[tuple[int, int]]:
    """Each thread's (voluntary, involuntary) switches but the main one's (psutil counts the process's only)."""
    out = []
    for t in Path(f"/proc/{p.pid}/task").iterdir() if Path(f"/proc/{p.pid}/task").exists() else []:
        if t.name == str(p.pid):
            continue
        try:
            fields = dict(line.split(":", 1) for line in (t / "status").read_text().splitlines() if ":" in line)
            out.append((int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])))
        except (OSError, KeyError, ValueError):
            pass
    return out


def make_peers(names: list[str], args: argparse.Namespace, up_port: int, tmp: Path) -> list[Peer]:
    cpu = ["taskset", "-c", str(args.proxy_cpu)] if args.proxy_cpu is not None else []
    upstream = f"http://127.0.0.1:{up_port}"
    peers = []
    for name in names:
        port, mport = _free_port(), _free_port()
        peer = Peer(name)
        peer.port = port  # type: ignore[attr-defined]
        if name == "nginx":
            exe = _apt("nginx-light", "nginx", args.install)
            conf = tmp / "nginx.conf"
            conf.write_text(f"""daemon off; master_process on; worker_processes 1; pid {tmp}/nginx.pid;
error_log {tmp}/nginx.err warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}; proxy_temp_path {tmp}; fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  upstream up {{ server 127.0.0.1:{up_port}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port} backlog=1024;
    location / {{ proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_buffering off; proxy_request_buffering off; proxy_read_timeout 600s; }}
  }}
  server {{ listen 127.0.0.1:{mport}; location /stub {{ stub_status; }} }}
}}
""")
            peer.argv = [*cpu, exe, "-c", str(conf), "-p", str(tmp)] if exe else []
            peer.unavailable = "" if exe else "nginx not installed (apt-get install nginx-light, or --install)"
        elif name == "haproxy":
            exe = _apt("haproxy", "haproxy", args.install)
            conf = tmp / "haproxy.cfg"
            conf.write_text(f"""global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  option http-no-delay
  http-reuse always
frontend fe
  bind 127.0.0.1:{port}
  default_backend be
frontend stats
  bind 127.0.0.1:{mport}
  http-request use-service prometheus-exporter if {{ path /metrics }}
backend be
  server s1 127.0.0.1:{up_port} maxconn 4096
""")
            peer.argv = [*cpu, exe, "-f", str(conf)] if exe else []
            peer.metrics_url, peer.read_own = f"http://127.0.0.1:{mport}/metrics", _own_haproxy
            peer.unavailable = "" if exe else "haproxy not installed (apt-get install haproxy, or --install)"
        elif name == "vllm-router":
            exe, version = _venv(args.cache, "vllm-router", (VLLM_ROUTER,), "vllm-router", args.install)
            peer.name = f"vllm-router {version}" if exe else name
            peer.argv = [*cpu, exe, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream, "--policy",
                         "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(mport),
                         "--log-level", "warning"] if exe else []
            peer.metrics_url, peer.read_own = f"http://127.0.0.1:{mport}/metrics", _own_vllm_router
            peer.unavailable = "" if exe else version
        elif name == "litellm":
            exe, version = _venv(args.cache, "litellm", LITELLM, "litellm", args.install)
            conf = tmp / "litellm.yaml"
            conf.write_text(f"""model_list:
  - model_name: "*"
    litellm_params: {{model: "openai/*", api_base: "{upstream}/v1", api_key: "none"}}
litellm_settings: {{callbacks: ["prometheus"], drop_params: true}}
general_settings: {{dangerously_permit_weak_or_unset_master_key: true}}
""")
            peer.name = f"litellm {version}" if exe else name
            peer.argv = [*cpu, exe, "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
                         "--num_workers", "1"] if exe else []
            peer.metrics_url, peer.read_own = f"http://127.0.0.1:{port}/metrics/", _own_litellm
            peer.unavailable = "" if exe else version
        elif name.startswith("rooflight-"):
            n = int(name.split("-")[1])
            peer.name = f"rooflight, {n} worker{'s' if n > 1 else ''}"
            peer.argv = [*cpu, sys.executable, "-m", "rooflight.agent.proxy.cli", "--upstream", upstream, "--listen",
                         f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{mport}", "--slo", "ttft=0.5,tpot=0.05",
                         "--windows", "3s,1m", "--workers", str(n), "--log-level", "warning"]
            peer.metrics_url, peer.read_own = f"http://127.0.0.1:{mport}/metrics", _own_rooflight
        else:
            raise SystemExit(f"--peers: no peer {name!r} (one of {', '.join(PEERS)})")
        peer.key = name  # type: ignore[attr-defined]
        peers.append(peer)
    return peers


def start(peer: Peer, tmp: Path) -> None:
    if not peer.argv:
        return
    log = open(tmp / f"{peer.key}.log", "wb")  # type: ignore[attr-defined]
    peer.proc = subprocess.Popen(peer.argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    peer.ps = psutil.Process(peer.proc.pid)
    try:
        _wait_listening(peer.port, within=120.0)  # type: ignore[attr-defined]
        if peer.key == "rooflight-2":  # type: ignore[attr-defined]
            time.sleep(1.0)  # the port answers once the parent listens: its workers say ready a moment later
    except RuntimeError as exc:
        peer.unavailable = f"did not start: {exc}; its log: {tmp / (peer.key + '.log')}"  # type: ignore[attr-defined]
        stop(peer)


def stop(peer: Peer) -> None:
    if peer.proc is None:
        return
    peer.proc.terminate()
    try:
        peer.proc.wait(15)
    except subprocess.TimeoutExpired:
        for p in peer.processes():
            p.kill()
        peer.proc.kill()
    peer.proc = None


# -- the run ---------------------------------------------------------------------------------------------------


async def phase(url: str, model: str, streams: int, offsets: list[float], seconds: float, out: Path_) -> None:
    """`streams` streams through `url`, each cut at `seconds` x 2 + 2 s (a peer that falls behind)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()
        # the rate and length named in the model too ("bench-RATE-SECONDS"): a peer that writes the request
        # again (LiteLLM) keeps the model and drops the fields it does not know
        rate, length = (float(x) for x in model.split("-")[1:])
        tasks = [asyncio.ensure_future(one_stream(session, url, length, rate, offsets[i], out, model))
                 for i in range(streams)]
        done, pending = await asyncio.wait(tasks, timeout=seconds * 2 + 2 + max(offsets[:streams], default=0.0))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        out.wall += time.monotonic() - start - min(offsets[:streams], default=0.0)
    out.chunks = len(out.lat)


def run_scenario(args: argparse.Namespace, streams: int, rate: float, up_port: int, peers: list[Peer],
                 up_ps: psutil.Process, me: psutil.Process) -> dict[str, Any]:
    rng = random.Random(f"{args.seed}-{streams}x{rate:g}")
    offsets = [rng.uniform(0.0, min(0.5, 10.0 / rate)) for _ in range(streams)]
    model = f"bench-{rate:g}-{args.seconds:g}"
    live = [p for p in peers if p.proc is not None]
    urls = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions"}
    urls.update({p.key: f"http://127.0.0.1:{p.port}/v1/chat/completions" for p in live})  # type: ignore[attr-defined]
    by_key = {p.key: p for p in live}  # type: ignore[attr-defined]
    for name, url in urls.items():  # warm up every path
        asyncio.run(phase(url, f"bench-{rate:g}-0.5", min(4, streams), offsets, 0.5, Path_()))
        if name in by_key and by_key[name].read_own is not None:
            by_key[name].read_own(url, by_key[name])
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        order = list(urls)
        rng.shuffle(order)
        print(f"  round {r + 1}: {', '.join(order)}", flush=True)
        got: dict[str, dict[str, Any]] = {}
        for name in order:
            peer = by_key.get(name)
            procs = peer.processes() if peer else []
            cpu0, up0, me0 = _cpu(procs), _cpu([up_ps]), _cpu([me])
            sys0, switches0 = _cpu(procs, system_only=True), _switches(procs)
            path = Path_()
            asyncio.run(phase(urls[name], model, streams, offsets, args.seconds, path))
            cpu = _cpu(procs) - cpu0
            kernel, switches = _cpu(procs, system_only=True) - sys0, _switches(procs) - switches0
            rss = [p.memory_info().rss for p in procs if p.is_running()] if procs else []
            own: dict[str, float] = {}
            if peer is not None and peer.read_own is not None:
                time.sleep(1.5)  # a refresh of its exports (rooflight: 1 s; its workers' records 10 ms)
                own = peer.read_own(urls[name], peer)
            quiet = _quiesce(procs + [up_ps])  # a peer that fell behind works on after its streams were cut
            got[name] = {"path": path, "cpu": cpu, "up_cpu": _cpu([up_ps]) - up0, "me_cpu": _cpu([me]) - me0,
                         "rss": rss, "own": own, "kernel": kernel, "switches": switches, "quiet_after_s": quiet}
        rounds.append(got)
    return summarize(streams, rate, rounds, list(urls))


def summarize(streams: int, rate: float, rounds: list[dict[str, dict[str, Any]]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"streams": streams, "rate": rate, "paths": {}}
    ms = 1e3
    for name in names:
        rows = []
        for got in rounds:
            d, p = got["direct"]["path"], got[name]["path"]
            if not (d.chunks and p.chunks):
                continue
            rows.append({
                "ttft_p50": (_q(p.ttft, 50) - _q(d.ttft, 50)) * ms, "ttft_p99": (_q(p.ttft, 99) - _q(d.ttft, 99)) * ms,
                "itl_p50": (_q(p.itl, 50) - _q(d.itl, 50)) * ms, "itl_p99": (_q(p.itl, 99) - _q(d.itl, 99)) * ms,
                "lat_p50": (_q(p.lat, 50) - _q(d.lat, 50)) * ms, "lat_p99": (_q(p.lat, 99) - _q(d.lat, 99)) * ms,
                "throughput": (p.chunks / p.wall) / (d.chunks / d.wall),
                "cpu_us_per_chunk": got[name]["cpu"] / p.chunks * 1e6,
                "kernel_us_per_chunk": got[name]["kernel"] / p.chunks * 1e6,
                "switches_per_chunk": got[name]["switches"] / p.chunks,
                "chunks_per_s": p.chunks / p.wall,
                "rss_mb": sum(got[name]["rss"]) / 2**20, "rss_each_mb": [x / 2**20 for x in got[name]["rss"]],
                "own": got[name]["own"],
                "client_ttft_p50_ms": _q(p.ttft, 50) * ms, "client_itl_p50_ms": _q(p.itl, 50) * ms,
                "client_itl_p99_ms": _q(p.itl, 99) * ms,
            })
        if not rows:
            out["paths"][name] = {"rounds": []}
            continue
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if isinstance(rows[0][k], float)}
        med["rss_mb"] = max(r["rss_mb"] for r in rows)
        med["rss_each_mb"] = max((r["rss_each_mb"] for r in rows), key=lambda x: sum(x))
        out["paths"][name] = {"median": med, "rounds": rows}
    return out


def report(s: dict[str, Any], peers: list[Peer]) -> None:
    names = {p.key: p.name for p in peers}  # type: ignore[attr-defined]
    print(f"\n{s['streams']} streams x {s['rate']:g} chunks/s ({s['streams'] * s['rate']:,.0f} chunks/s offered); "
          f"medians over rounds, each against the direct path of its round")
    print(f"{'path':24} {'us/chunk':>9} {'kernel':>7} {'switch':>6} {'RSS MB':>7} {'+TTFT p50':>10} {'p99':>8} "
          f"{'+ITL p50':>9} {'p99':>8} {'thru':>5}  its own metrics (final round)")
    for key, row in s["paths"].items():
        m = row.get("median")
        if not m:
            print(f"{names.get(key, key):24} no chunks")
            continue
        own = row["rounds"][-1]["own"]
        said = ", ".join(f"{k} {v * 1e3:.2f} ms" if "count" not in k else f"{k} {v:.0f}" for k, v in own.items())
        if key == "direct":
            print(f"{'direct':24} {'':>9} {'':>7} {'(client TTFT p50 ' + format(m['client_ttft_p50_ms'], '.1f') + ' ms,':>20}"
                  f" ITL p50/p99 {m['client_itl_p50_ms']:.2f}/{m['client_itl_p99_ms']:.2f} ms)")
            continue
        print(f"{names.get(key, key):24} {m['cpu_us_per_chunk']:9.1f} {m['kernel_us_per_chunk']:7.1f} "
              f"{m['switches_per_chunk']:6.2f} {m['rss_mb']:7.0f} {m['ttft_p50']:+10.2f} "
              f"{m['ttft_p99']:+8.1f} {m['itl_p50']:+9.2f} {m['itl_p99']:+8.2f} {m['throughput']:5.2f}  "
              f"{said or ('none' if key == 'nginx' else '')}")


def targets(results: list[dict[str, Any]]) -> list[str]:
    """The targets of docs/proxy.md, each with what this run measured: met or not."""
    lines = []

    def med(s: dict[str, Any], key: str) -> dict[str, float] | None:
        return s["paths"].get(key, {}).get("median")

    for s in results:
        scen = f"{s['streams']}x{s['rate']:g}"
        one, two, ng, vr = (med(s, k) for k in ("rooflight-1", "rooflight-2", "nginx", "vllm-router"))
        if one and ng:
            ratio = one["cpu_us_per_chunk"] / ng["cpu_us_per_chunk"]
            lines.append(f"{scen}: rooflight CPU per chunk {ratio:.2f}x nginx's (target <= 1.2): "
                         f"{'met' if ratio <= 1.2 else 'NOT met'}")
        if one and vr:
            ratio = one["cpu_us_per_chunk"] / vr["cpu_us_per_chunk"]
            lines.append(f"{scen}: rooflight CPU per chunk {ratio:.2f}x vllm-router's (target <= 1.0): "
                         f"{'met' if ratio <= 1.0 else 'NOT met'}")
        if one and two:
            ratio = two["cpu_us_per_chunk"] / one["cpu_us_per_chunk"]
            dt = two["ttft_p50"] - one["ttft_p50"]
            lines.append(f"{scen}: 2 workers / 1, CPU per chunk {ratio:.2f} (target <= 1.05): "
                         f"{'met' if ratio <= 1.05 else 'NOT met'}; added TTFT p50 {dt:+.2f} ms (target <= +1): "
                         f"{'met' if dt <= 1.0 else 'NOT met'}")
            each = max(two["rss_each_mb"][1:] or [0.0])
            lines.append(f"{scen}: RSS per worker {max(one['rss_mb'], each):.0f} MB (target <= 50): "
                         f"{'met' if max(one['rss_mb'], each) <= 50 else 'NOT met'}")
        if s["streams"] == 64 and s["rate"] == 100 and one:
            lines.append(f"{scen}: rooflight added TTFT p50 {one['ttft_p50']:+.2f} ms (target <= 2): "
                         f"{'met' if one['ttft_p50'] <= 2 else 'NOT met'}")
            if ng:
                lines.append(f"{scen}: rooflight added ITL p99 {one['itl_p99']:+.2f} ms, nginx's {ng['itl_p99']:+.2f}"
                             f" (target <= nginx's + 1): {'met' if one['itl_p99'] <= ng['itl_p99'] + 1 else 'NOT met'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="64x100,64x1000,256x200", help="STREAMSxRATE,...")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"a subset of {','.join(PEERS)}")
    ap.add_argument("--seconds", type=float, default=4.0, help="each phase's length")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--proxy-cpu", type=int, default=None, help="pin every peer to this core; the upstream and "
                    "the client go on the others")
    ap.add_argument("--install", action="store_true", help="apt-get the Debian peers and pip the PyPI ones into "
                    "venvs under --cache when missing")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the PyPI peers' venvs live")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # (progress, into a file too)
    scenarios = [tuple(float(x) for x in s.split("x")) for s in args.scenarios.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    ctx = multiprocessing.get_context("spawn")
    up_port = _free_port()
    up = ctx.Process(target=upstream_main, args=(up_port,), daemon=True)
    up.start()
    _wait_listening(up_port)
    up_ps, me = psutil.Process(up.pid), psutil.Process()
    if args.proxy_cpu is not None:
        rest = sorted(set(range(psutil.cpu_count())) - {args.proxy_cpu})
        if rest:
            up_ps.cpu_affinity(rest)
            me.cpu_affinity(rest)
    peers = make_peers(args.peers.split(","), args, up_port, tmp)
    results = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the peers are stopped on the way out
    try:
        for peer in peers:
            if not peer.unavailable:
                start(peer, tmp)
        print(f"bench_peers: {psutil.cpu_count()} CPUs, peers on core {args.proxy_cpu}, load "
              f"{', '.join(f'{x:.1f}' for x in psutil.getloadavg())}, {args.rounds} rounds x {args.seconds:g} s")
        for peer in peers:
            print(f"  {peer.name}: {'NOT RUN: ' + peer.unavailable if peer.unavailable else ' '.join(peer.argv)}")
        for streams, rate in scenarios:
            s = run_scenario(args, int(streams), rate, up_port, peers, up_ps, me)
            report(s, peers)
            results.append(s)
    finally:
        for peer in peers:
            stop(peer)
        up.terminate()
        up.join(10)
    print()
    for line in targets(results):
        print(line)
    print("\n| per chunk, proxy CPU (RSS) | " + " | ".join(f"{int(s['streams'])} x {s['rate']:,.0f}/s" for s in results) + " |")
    print("|---|" + "---|" * len(results))
    for peer in peers:
        cells = []
        for s in results:
            m = s["paths"].get(peer.key, {}).get("median")  # type: ignore[attr-defined]
            cells.append(f"{m['cpu_us_per_chunk']:.1f} us ({m['rss_mb']:.0f} MB), TTFT {m['ttft_p50']:+.1f} ms, "
                         f"ITL p99 {m['itl_p99']:+.1f} ms, x{m['throughput']:.2f}" if m else "not run")
        print(f"| {peer.name} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "peers": {p.key: p.name for p in peers},  # type: ignore[attr-defined]
                                               "unavailable": {p.key: p.unavailable for p in peers if p.unavailable}},  # type: ignore[attr-defined]
                                              default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
