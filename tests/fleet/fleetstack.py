"""A fleet on loopback, from real components: clusters of `rooflight demo` pods, each cluster scraped by
Prometheus in agent mode (an HA pair in one), remote-writing to a central VictoriaMetrics (vmalert its
ruler) and a central Prometheus (its remote-write receiver, its own ruler), both notifying one Alertmanager.

Every server is a Debian package's binary (prometheus, victoria-metrics, vmalert, prometheus-alertmanager)
started here on 127.0.0.1 with a free port and a temporary directory, and stopped by its PID; nothing of
the packages' own services is used. Between each cluster and each store runs a Link, a TCP forwarder the
test can cut to stand for a network partition: the cluster's Prometheus keeps scraping into its WAL and
delivers the backlog once the link is mended, late, as it would after a real outage.

The wiring is the one docs/deploy.md (section Fleet) shows:
- each cluster's Prometheus: `--enable-feature=agent`, external labels {cluster, __replica__} (the HA
  pair differs in __replica__ only, the label Mimir's HA tracker reads);
- VictoriaMetrics: `-relabelConfig` drops __replica__ so the pair writes one series, and
  `-dedup.minScrapeInterval` (the scrape interval) keeps one sample of the two per interval;
- the central Prometheus has no deduplication (Thanos Query and Mimir's HA tracker do it in front of
  theirs): one replica of the pair writes to it, __replica__ dropped on the way (write_relabel_configs),
  as the HA tracker passes one replica's samples without the label;
- a "truth" Prometheus scrapes every pod directly with the same labels and evaluates the same rules in one
  piece (`rooflight rules`, no split): what each cluster's numbers are when nothing is remote-written.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from demo_procs import start_rooflight, stop_process
from promstack import PromAPI, PromError, free_port
from rooflight.rules.config import RulesConfig, ttft_slo

BINARIES = {"prometheus": "prometheus", "victoria-metrics": "victoria-metrics", "vmalert": "vmalert",
            "alertmanager": "prometheus-alertmanager"}
SCRAPE_S = 2  # each cluster's scrape interval, and VictoriaMetrics' dedup interval
EVAL_S = 5  # both central rulers' evaluation interval
# VictoriaMetrics answers a query for `now` as of now minus -search.latencyOffset (30 s by default), so each
# vmalert evaluation sees the store that much earlier, and a record that reads another record adds as much
# again (groups needed reads the pool's tokens, which read each rank's: 90 s behind at the default). The
# stage shortens it so both rulers evaluate the same instants; docs/deploy.md (Fleet) gives the default's cost.
VM_LATENCY_S = 5
READY_WITHIN_S = 60.0  # a server binding and opening its storage on a busy 2-core machine
# The shipped rules with what the stage needs changed: a TTFT threshold the demo's KV-wall pool burns
# (0.1 s, a bucket edge) and its steady pools meet; the capacity record over the agent's 1 m window (its
# 5 m window needs five minutes of samples first); RooflightClusterAbsent after 2 m of silence, not 10.
STAGE_CONFIG = replace(RulesConfig(), ttft=ttft_slo(threshold_seconds=0.1), capacity_window="1m",
                       cluster_absent_for="2m")


def missing_binaries() -> list[str]:
    """The Debian binaries the fleet needs that are not on PATH (.ci/install provides them)."""
    return [b for b in BINARIES.values() if shutil.which(b) is None]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Daemon:
    """One server binary on 127.0.0.1, its log in its own directory; started until `ready` answers 200,
    stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, argv: Sequence[str], ready: str) -> None:
        with open(self.dir / "log", "wb") as log:
            self.proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + READY_WITHIN_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PromError(f"{self.name} exited with {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                if _get(f"{self.url}{ready}", timeout=1)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise PromError(f"{self.name} not ready within {READY_WITHIN_S:g} s: {self.log()[-3000:]}")

    def log(self) -> str:
        path = self.dir / "log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def write(self, name: str, doc: Any) -> Path:
        path = self.dir / name
        path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        return path


class Store(PromAPI):
    """A PromAPI at a Daemon's address."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        self.daemon, self.name = daemon, name

    @property
    def url(self) -> str:  # type: ignore[override]
        return self.daemon.url

    def describe(self) -> str:
        return f"{self.name}'s log: {self.daemon.log()[-2000:]}"


class Link:
    """127.0.0.1:port forwarded to `upstream` (host, port) by an event loop of its own; cut() closes the
    listener and every open connection (the sender sees refused connections and retries), mend() listens
    again on the same port."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.base_events.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"link-{self.port}", daemon=True)
        self.thread.start()
        self.mend()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        self.open |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self.open -= {writer, up_writer}

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for writer in list(self.open):
            writer.transport.abort()

    def mend(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._close())

    async def _drain(self) -> None:
        """Close everything, then let each connection's task see its transport gone and end."""
        await self._close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    def stop(self) -> None:
        self._call(self._drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@dataclass(frozen=True)
class Pod:
    """One engine and its sidecar: `rooflight demo` (a simulated vLLM and the real agent)."""

    cluster: str
    namespace: str
    name: str  # also the agent's target label, as the chart sets it
    scenario: str
    seed: int


@dataclass
class RunningPod:
    pod: Pod
    agent: int  # ports
    engine: int
    proc: subprocess.Popen[bytes] = field(repr=False)


def scrape_configs(pods: Sequence[RunningPod], *, cluster_label: bool) -> list[dict[str, Any]]:
    """The agent's scrape (job rooflight) and the engine's (job vllm), one static target per pod with its
    namespace and pod (and its cluster, where no external label adds it), as a PodMonitor would."""
    def static(port_of: str) -> list[dict[str, Any]]:
        return [{"targets": [f"127.0.0.1:{getattr(p, port_of)}"],
                 "labels": {**({"cluster": p.pod.cluster} if cluster_label else {}),
                            "namespace": p.pod.namespace, "pod": p.pod.name}} for p in pods]
    return [{"job_name": "rooflight", "static_configs": static("agent")},
            {"job_name": "vllm", "static_configs": static("engine")}]


def remote_write(port: int, *, drop_replica: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/api/v1/write",
                             # resume within a second or two of a mended link, and send in small batches
                             "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "2s"}}
    if drop_replica:
        entry["write_relabel_configs"] = [{"action": "labeldrop", "regex": "__replica__"}]
    return entry


class Fleet:
    """The whole fleet, started in order and stopped in reverse; `root` holds every server's directory."""

    def __init__(self, pods: Sequence[Pod], ha_cluster: str, pod_rules: Path, fleet_rules: Path, all_rules: Path,
                 gpu_hour_cost: float = 2.5, vmalert_rules: tuple[Path, Path] | None = None) -> None:
        """`vmalert_rules`: the pod and fleet halves as vmalert is given them (Debian 12's 1.79 has no
        keep_firing_for: `rooflight rules --keep-firing-for ''`); by default the same files as Prometheus."""
        self.pods, self.ha_cluster = list(pods), ha_cluster
        self.rule_files = {"pod": pod_rules, "fleet": fleet_rules, "all": all_rules}
        self.vmalert_rules = {"pod": vmalert_rules[0], "fleet": vmalert_rules[1]} if vmalert_rules else self.rule_files
        self.gpu_hour_cost = gpu_hour_cost
        self.root = Path(tempfile.mkdtemp(prefix="rooflight-fleet-"))
        self.daemons: list[Daemon] = []
        self.links: dict[tuple[str, str], Link] = {}  # (cluster, store) -> its link
        self.agents: dict[str, list[Daemon]] = {}  # cluster -> its Prometheus (agent mode), HA replicas
        self.running: list[RunningPod] = []

    @property
    def clusters(self) -> list[str]:
        return list(dict.fromkeys(p.cluster for p in self.pods))

    def _daemon(self, name: str) -> Daemon:
        daemon = Daemon(name, self.root)
        self.daemons.append(daemon)
        return daemon

    def _copy_rules(self, daemon: Daemon, *scopes: str, files: Mapping[str, Path] | None = None) -> list[str]:
        names = []
        for scope in scopes:
            names.append(f"rooflight-{scope}.rules.yaml")
            shutil.copyfile((files or self.rule_files)[scope], daemon.dir / names[-1])
        return names

    def start(self) -> "Fleet":
        try:
            self._start_pods()
            self._start_alertmanager()
            self._start_victoria_metrics()
            self._start_central_prometheus()
            self._start_truth()
            for cluster in self.clusters:
                self._start_cluster(cluster)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_pods(self) -> None:
        for pod in self.pods:
            agent, engine = free_port(), free_port()
            proc = start_rooflight(
                "demo", "--scenario", pod.scenario, "--seed", str(pod.seed), "--target-name", pod.name,
                "--listen", f"127.0.0.1:{agent}", "--engine-listen", f"127.0.0.1:{engine}", "--interval", "1s",
                "--gpu-hour-cost", str(self.gpu_hour_cost), "--log-level", "warning")
            self.running.append(RunningPod(pod, agent, engine, proc))
        deadline = time.monotonic() + READY_WITHIN_S
        for running in self.running:
            while _status(f"http://127.0.0.1:{running.agent}/-/ready") != 200:
                assert running.proc.poll() is None, f"{running.pod} exited: {stop_process(running.proc)[-2000:]}"
                assert time.monotonic() < deadline, f"{running.pod}'s agent is not ready"
                time.sleep(0.2)

    def _start_alertmanager(self) -> None:
        am = self.alertmanager = self._daemon("alertmanager")
        config = am.write("alertmanager.yml", {
            "route": {"receiver": "null", "group_wait": "1s", "group_interval": "5s", "repeat_interval": "1h"},
            "receivers": [{"name": "null"}]})
        am.start([BINARIES["alertmanager"], f"--config.file={config}", f"--storage.path={am.dir / 'data'}",
                  f"--web.listen-address=127.0.0.1:{am.port}", "--cluster.listen-address=", "--log.level=warn"],
                 "/-/ready")

    def _start_victoria_metrics(self) -> None:
        vm = self._daemon("victoria-metrics")
        relabel = vm.write("relabel.yml", [{"action": "labeldrop", "regex": "__replica__"}])
        vm.start([BINARIES["victoria-metrics"], f"-storageDataPath={vm.dir / 'data'}",
                  f"-httpListenAddr=127.0.0.1:{vm.port}", f"-dedup.minScrapeInterval={SCRAPE_S}s",
                  f"-relabelConfig={relabel}", f"-search.latencyOffset={VM_LATENCY_S}s", "-loggerLevel=WARN"], "/health")
        vmalert = self._daemon("vmalert")
        rules = self._copy_rules(vmalert, "pod", "fleet", files=self.vmalert_rules)
        vmalert.start([BINARIES["vmalert"], *(f"-rule={vmalert.dir / r}" for r in rules),
                       f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}", f"-remoteRead.url={vm.url}",
                       f"-notifier.url={self.alertmanager.url}", f"-evaluationInterval={EVAL_S}s",
                       f"-httpListenAddr=127.0.0.1:{vmalert.port}", "-loggerLevel=WARN"], "/health")
        self.vm, self.vmalert = Store(vm, "victoria-metrics"), Store(vmalert, "vmalert")

    def _start_central_prometheus(self) -> None:
        prom = self._daemon("central-prometheus")
        rules = self._copy_rules(prom, "pod", "fleet")
        config = prom.write("prometheus.yml", {
            "global": {"evaluation_interval": f"{EVAL_S}s"},
            "rule_files": rules,
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager.port}"]}]}]},
        })
        prom.start(_prometheus(prom, config, "--web.enable-remote-write-receiver"), "/-/ready")
        self.prometheus = Store(prom, "central Prometheus")

    def _start_truth(self) -> None:
        truth = self._daemon("truth-prometheus")
        rules = self._copy_rules(truth, "all")
        config = truth.write("prometheus.yml", {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{EVAL_S}s"},
            "rule_files": rules,
            "scrape_configs": scrape_configs(self.running, cluster_label=True),
        })
        truth.start(_prometheus(truth, config), "/-/ready")
        self.truth = Store(truth, "truth Prometheus")

    def _start_cluster(self, cluster: str) -> None:
        pods = [p for p in self.running if p.pod.cluster == cluster]
        for store, upstream in (("vm", self.vm.daemon.port), ("prometheus", self.prometheus.daemon.port)):
            self.links[(cluster, store)] = Link(upstream)
        replicas = ("a", "b") if cluster == self.ha_cluster else ("a",)
        self.agents[cluster] = []
        for replica in replicas:
            agent = self._daemon(f"prometheus-{cluster}-{replica}")
            writes = [remote_write(self.links[(cluster, "vm")].port)]
            if replica == "a":  # the central Prometheus cannot deduplicate: one replica writes to it
                writes.append(remote_write(self.links[(cluster, "prometheus")].port, drop_replica=True))
            config = agent.write("prometheus.yml", {
                "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                           "external_labels": {"cluster": cluster, "__replica__": replica}},
                "scrape_configs": scrape_configs(pods, cluster_label=False),
                "remote_write": writes,
            })
            agent.start([BINARIES["prometheus"], "--enable-feature=agent", f"--config.file={config}",
                         f"--storage.agent.path={agent.dir / 'wal'}", f"--web.listen-address=127.0.0.1:{agent.port}",
                         "--log.level=warn"], "/-/ready")
            self.agents[cluster].append(agent)

    def stop(self) -> None:
        for link in self.links.values():
            link.stop()
        for daemon in reversed(self.daemons):
            daemon.stop()
        for running in self.running:
            stop_process(running.proc)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- reading it ----------------------------------------------------------------------------------

    def firing(self, ruler: Store) -> set[tuple[tuple[str, str], ...]]:
        """The ruler's firing alerts (its own /api/v1/alerts), each as its sorted labels."""
        alerts = ruler.api("alerts", {})["alerts"] or []  # vmalert answers null for none
        return {tuple(sorted(a["labels"].items())) for a in alerts if a["state"] == "firing"}

    def notified(self) -> set[tuple[tuple[str, str], ...]]:
        """What the Alertmanager holds (active, from either ruler), each as its sorted labels."""
        status, body = _get(f"{self.alertmanager.url}/api/v2/alerts?active=true&silenced=false&inhibited=false")
        assert status == 200, body
        return {tuple(sorted(a["labels"].items())) for a in yaml.safe_load(body)}

    def sent_samples(self, agent: Daemon) -> dict[str, float]:
        """prometheus_remote_storage_samples_total of one cluster Prometheus, by its remote-write URL."""
        status, body = _get(f"{agent.url}/metrics")
        assert status == 200
        out: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("prometheus_remote_storage_samples_total{"):
                labels, value = line.rsplit(" ", 1)
                url = labels.split('url="', 1)[1].split('"', 1)[0]
                out[url] = float(value)
        return out


def _prometheus(daemon: Daemon, config: Path, *flags: str) -> list[str]:
    return [BINARIES["prometheus"], f"--config.file={config}", f"--storage.tsdb.path={daemon.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{daemon.port}", "--log.level=warn", *flags]


def _status(url: str) -> int:
    try:
        return _get(url, timeout=2)[0]
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0
