"""Every dashboard query on a real Prometheus scraping two demo pods, and every topology variable narrowing to one pod.

Two `rooflight demo` processes (each a simulated vLLM plus the real agent) stand for two pods of a fleet.
One Prometheus (tests/promstack.py, scrape every 1 s) scrapes each pod's agent and engine with the labels
Kubernetes service discovery and a multi-cluster setup would attach, set here as static labels per
target: pod llm-0 in cluster east, namespace chat, job chat/llm; pod llm-1 in west, batch, batch/llm. Both
agents' `target` is rewritten to 127.0.0.1:8000 at scrape time, as every sidecar's is, so only the
topology labels tell the two apart. The agent's and the engine's scrape of one pod share its labels
(one pod, two ports) and differ in `instance`. Each pod also runs a `rooflight proxy` in front of a fake
streaming server (client_traffic.py), with clients streaming through it all along; its series are scraped
with the agent's labels, instance included, as they come when the agent runs the proxy itself (one
sidecar, one scrape), and its `target` is rewritten like the agent's. Prometheus evaluates the shipped
recording rules (rules/rooflight.rules.yaml, its alerts left out), which the SLO and fleet panels read.

- With every variable at All, every query returns data (but for the metrics and records in ABSENT, each
  with its reason), and every query that keeps the pod returns both pods.
- Each of cluster, namespace, job, pod and instance set to pod llm-0's value (the others at All) narrows
  every query to llm-0: every row that carries `pod` is llm-0's, and a row without it (an aggregate by
  design) equals the same query with every topology variable set to llm-0, at the same instant.
- The variables' own queries are chained: given llm-0's cluster, the namespace, job, pod and instance
  variables offer llm-0's values alone.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import pytest
import yaml

from rooflight.dashboards.metrics import metric_names, pending_gpu_metrics, record_names
import promstack
from demo_procs import start_demo, start_rooflight, stop_process
from client_traffic import ClientTraffic
from dashboard_queries import dashboards, exprs, fill, query_variables
from support import ROOT

SHARED_TARGET = "127.0.0.1:8000"
RULES = ROOT / "rules" / "rooflight.rules.yaml"
PODS = {
    "llm-0": {"cluster": "east", "namespace": "chat", "job": "chat/llm"},
    "llm-1": {"cluster": "west", "namespace": "batch", "job": "batch/llm"},
}
NARROWING = ("cluster", "namespace", "job", "pod", "instance")
# Metrics and recording rules whose queries may answer nothing on the steady demo, with the reason (a query
# that answers is checked all the same).
ABSENT = {
    "ALERTS": "only the recording rules are loaded here, and no Rooflight alert would fire on the steady scenario",
    "rooflight_spec_decode_acceptance_ratio": "the simulated vLLM runs no speculative decoding",
    "rooflight_kv_transfer_latency_seconds": "SGLang's transfer times; the demo is a vLLM",
    "rooflight_kv_transfer_speed_bytes_per_second": "SGLang's transfer speeds; the demo is a vLLM",
    "rooflight_kv_transfer_failures_total": "failed transfers between prefill and decode instances; the demo is one",
    "rooflight_cost_per_million_tokens": "`rooflight demo` takes no --gpu-hour-cost",
    "rooflight_blended_cost_per_million_tokens": "`rooflight demo` takes no --gpu-hour-cost",
    "model:rooflight_gpu_hour_cost:sum": "`rooflight demo` takes no --gpu-hour-cost",
    "model_phase:rooflight_cost_per_million_tokens:rate5m": "`rooflight demo` takes no --gpu-hour-cost",
    "model_phase:rooflight_groups_needed:rate5m": "reads the agent's 5m window, exported once 5 minutes are sampled",
}

needs_prometheus = pytest.mark.skipif(not promstack.available(), reason="Debian's prometheus is not installed")


class TwoPodStack(promstack.PromStack):
    """Scrapes each pod's agent and engine as one job, with the pod's topology labels on both targets; a
    pod's proxy metrics, when given, with the agent's labels and instance (one sidecar, one scrape)."""

    def __init__(self, pods: dict[str, tuple[str, str]], proxies: dict[str, str] | None = None,
                 rule_files: Sequence[Path] = ()) -> None:
        super().__init__([agent for agent, _ in pods.values()], rule_files)
        self.pods = pods  # pod -> (agent host:port, engine host:port)
        self.proxies = proxies or {}  # pod -> its proxy's metrics host:port

    def config(self, rule_names: Sequence[str]) -> dict[str, Any]:
        doc = super().config(rule_names)
        doc["scrape_configs"] = [{
            "job_name": PODS[pod]["job"],
            "metrics_path": self.metrics_path,
            "static_configs": [{"targets": list(addresses), "labels": self._labels(pod)}] + (
                [{"targets": [self.proxies[pod]], "labels": {**self._labels(pod), "instance": addresses[0]}}]
                if pod in self.proxies else []),
            "metric_relabel_configs": [{"source_labels": ["target"], "regex": r"127\.0\.0\.1:[0-9]+",
                                        "target_label": "target", "replacement": SHARED_TARGET}],
        } for pod, addresses in self.pods.items()]
        return doc

    @staticmethod
    def _labels(pod: str) -> dict[str, str]:
        return {"pod": pod, "cluster": PODS[pod]["cluster"], "namespace": PODS[pod]["namespace"]}


def _start_proxy(upstream: str, metrics: str) -> subprocess.Popen[bytes]:
    return start_rooflight("proxy", "--upstream", upstream, "--listen", f"127.0.0.1:{promstack.free_port()}",
                           "--metrics-listen", metrics, "--slo", "ttft=0.5,tpot=0.05", "--log-level", "warning")


def _proxy_url(proc: subprocess.Popen[bytes]) -> str:
    """Where clients reach the proxy: its --listen address."""
    args = [str(a) for a in proc.args]  # type: ignore[union-attr]
    return "http://" + args[args.index("--listen") + 1]


def _recording_rules(path: Path) -> Path:
    """The shipped rule file's recording rules alone (the panels read them; its alerts are tested in rules/)."""
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    groups = [{**g, "rules": [r for r in g["rules"] if "record" in r]} for g in doc["groups"]]
    path.write_text(yaml.safe_dump({"groups": [g for g in groups if g["rules"]]}), encoding="utf-8")
    return path


def _values(pod: str, agent: str) -> dict[str, str]:
    """The variable values that select `pod` alone, one variable at a time."""
    return {**PODS[pod], "pod": pod, "instance": agent}


def _rows(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Rows keyed by their label set, for comparing two answers of the same query."""
    return {repr(sorted(r["metric"].items())): float(r["value"][1]) for r in rows}


def test_the_stack_gives_each_pod_its_labels_and_one_shared_target() -> None:
    stack = TwoPodStack({"llm-0": ("127.0.0.1:1", "127.0.0.1:2"), "llm-1": ("127.0.0.1:3", "127.0.0.1:4")},
                        {"llm-0": "127.0.0.1:5", "llm-1": "127.0.0.1:6"})
    jobs = stack.config([])["scrape_configs"]
    assert [j["job_name"] for j in jobs] == ["chat/llm", "batch/llm"]
    labels = {"pod": "llm-0", "cluster": "east", "namespace": "chat"}
    assert jobs[0]["static_configs"] == [{"targets": ["127.0.0.1:1", "127.0.0.1:2"], "labels": labels},
                                         {"targets": ["127.0.0.1:5"], "labels": {**labels, "instance": "127.0.0.1:1"}}]
    assert all(j["metric_relabel_configs"][0]["replacement"] == SHARED_TARGET for j in jobs)
    assert fill('x{pod=~"$pod|", instance=~"$instance"}', pod="llm-0") == 'x{pod=~"llm-0|", instance=~".*"}'


@pytest.mark.prometheus
@needs_prometheus
def test_every_query_answers_for_both_pods_and_each_variable_narrows_to_one(tmp_path: Path) -> None:
    ports = {pod: (f"127.0.0.1:{promstack.free_port()}", f"127.0.0.1:{promstack.free_port()}") for pod in PODS}
    proxy_metrics = {pod: f"127.0.0.1:{promstack.free_port()}" for pod in PODS}
    traffic = ClientTraffic()
    upstream = traffic.start()
    demos = [start_demo("steady", *ports[pod], seed=seed) for seed, pod in enumerate(PODS, start=1)]
    proxies = [_start_proxy(upstream, proxy_metrics[pod]) for pod in PODS]
    traffic.drive([_proxy_url(proc) for proc in proxies])
    try:
        with TwoPodStack(ports, proxy_metrics, [_recording_rules(tmp_path / "records.yaml")]) as prom:
            # the tail inflation needs 30 s of agent samples (3 x the shortest window) before it is exported
            for metric in ("rooflight_mbu_ratio", "rooflight_itl_tail_inflation", "rooflight_client_goodput_ratio"):
                deadline = time.monotonic() + 90
                while len(prom.query(f'count by (pod) ({metric}{{target="{SHARED_TARGET}"}})')) < len(PODS):
                    for proc in demos + proxies:
                        assert proc.poll() is None, f"{proc.args[1:3]} exited: {stop_process(proc)[-2000:]}"
                    assert time.monotonic() < deadline, f"{metric} not from both pods: {prom.targets_health()}"
                    time.sleep(1.0)
            time.sleep(16)  # 15 s rates over at least two scrapes of every counter
            at = time.time() - 1.0
            chosen, agent = "llm-0", ports["llm-0"][0]
            checked, empty, mixed = 0, [], []
            for name, d in dashboards().items():
                for title, ref, expr in exprs(d):
                    where = f"{name}/{title}/{ref}"
                    everything = prom.query(fill(expr), at)
                    if not everything:
                        if not (metric_names(expr) | record_names(expr)) & (set(ABSENT) | pending_gpu_metrics()):
                            empty.append(f"{where}: {fill(expr)}")
                        continue
                    pods = {r["metric"]["pod"] for r in everything if "pod" in r["metric"]}
                    if pods and pods != set(PODS):
                        mixed.append(f"{where}: all pods selected, answered for {sorted(pods)}")
                    alone = _rows(prom.query(fill(expr, **_values(chosen, agent)), at))
                    for var, value in _values(chosen, agent).items():
                        rows = prom.query(fill(expr, **{var: value}), at)
                        answered = {r["metric"].get("pod") for r in rows}
                        if not rows or answered - {chosen, None}:
                            mixed.append(f"{where}: ${var}={value} answered for {sorted(map(str, answered))}")
                        unlabelled = {k: v for k, v in _rows(rows).items() if "'pod'" not in k}
                        if unlabelled and unlabelled != {k: v for k, v in alone.items() if "'pod'" not in k}:
                            mixed.append(f"{where}: ${var}={value} aggregates more than {chosen}: {unlabelled}")
                    checked += 1
            assert empty == [], "\n".join(empty)
            assert mixed == [], "\n".join(mixed)
            assert checked > 50

            # the variables' own queries: each narrows to the pod chosen above it
            d = dashboards()["rooflight-overview.json"]
            offered = {var: {r["metric"].get(label) for r in prom.query(fill(selector, cluster="east"), at)}
                       for var, selector, label in query_variables(d)}
            assert offered["cluster"] == {"east", "west"}  # its own query is not filtered by itself
            want = _values(chosen, agent)
            for var in ("namespace", "job", "pod", "instance"):
                assert offered[var] == {want[var]}, (var, offered[var])
            assert offered["target"] == {SHARED_TARGET}
            assert traffic.completed > 100 and traffic.failed == 0, (traffic.completed, traffic.failed)
            assert traffic.unavailable >= traffic.completed // 20, (traffic.completed, traffic.unavailable)
    finally:
        traffic.stop()
        for proc in demos + proxies:
            stop_process(proc)
    assert all(proc.returncode is not None for proc in demos + proxies)
