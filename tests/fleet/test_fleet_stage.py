"""The fleet stage: two clusters remote-writing to VictoriaMetrics (vmalert) and to a central Prometheus, one
cluster an HA pair, the other cut off from both stores for five minutes (fleetstack.py builds it all).

Run by .ci/fleet.sh (`pytest -m fleet tests/fleet`, about 9 minutes, mostly waiting); the fast suite leaves
it out. One scenario runs once (the `fleet_run` fixture) and each test reads what it recorded:

    0 s     five `rooflight demo` pods start: east/chat (2 steady), east/batch (1 at the KV wall, its TTFT
            over the stage's 0.1 s SLO threshold), west/chat (2 steady, whose TTFT stays within it)
    60 s    the HA and storage checks; then west's links to both stores are cut
    360 s   the links are mended; west's Prometheus delivers its five-minute backlog
    480 s   every fleet record, every firing alert and every fleet dashboard query, read on both stores

The rules are the shipped ones rendered with three stage settings (fleetstack.STAGE_CONFIG): the TTFT
threshold above, the capacity record read over the agent's 1 m window (its 5 m window would need five
minutes of samples first) and RooflightClusterAbsent after 2 m of silence instead of 10 (so it fires
inside the cut).

Comparisons wait until every series is older than the 5 m rate window: Prometheus divides a series'
first increase by the whole window (rate5m reads low for five minutes), VictoriaMetrics by the span it
has, so the two agree only once windows are full (docs/deploy.md, section Fleet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import json
import re
import sys

import pytest

import fleetstack as fs
from rooflight.dashboards.metrics import metric_names, record_names
from fleetstack import STAGE_CONFIG
from rooflight.rules.config import RulesConfig
from rooflight.rules.fleet import CLUSTER_ALERT
from rooflight.rules.render import groups, render
from support import ROOT, TESTS

sys.path.insert(0, str(TESTS / "dashboards"))  # dashboard_queries: the dashboards' queries as Grafana sends them
from dashboard_queries import exprs, fill, query_variables  # noqa: E402

pytestmark = [pytest.mark.fleet, pytest.mark.prometheus, pytest.mark.victoriametrics]

PODS = (
    fs.Pod("east", "chat", "llm-chat-a", "steady", 1),
    fs.Pod("east", "chat", "llm-chat-b", "steady", 2),
    fs.Pod("east", "batch", "llm-batch-a", "kv-wall", 3),
    fs.Pod("west", "chat", "llm-chat-a", "steady", 4),
    fs.Pod("west", "chat", "llm-chat-b", "steady", 5),
)
HA, CUT = "east", "west"
GPU_HOUR_COST = 2.5
WARM_S = 60.0
GAP_S = 300.0  # five minutes: Prometheus's lookback, past which a silent cluster's series are gone
SETTLE_S = 150.0  # the backlog lands, both rulers evaluate over complete windows, then a minute to average over
STAGE_S = 20 * 60.0  # longer than the stage runs (warm-up, the cut, the settling): a window past it is young
LATE_S = 45.0  # read the stores this far back, past every ruler's last evaluation and remote write
SMOOTH = "1m"  # records averaged over twelve evaluations, so two rulers' evaluation instants do not matter
RELATIVE = 0.10  # measured: the worst record 2.0% off the truth (docs/deploy.md, section Fleet)
ABSOLUTE = 2e-3  # error ratios near 0
POLL_S = 5.0
# The expected pages of the whole run, as (alertname, cluster, namespace, severity).
EXPECTED_ALERTS = {("RooflightTTFTBudgetBurn", "east", "batch", "critical"), (CLUSTER_ALERT, "west", "", "warning")}
# Dashboard queries with no data in this stage (any record or metric whose name holds the key), and why.
ABSENT = {
    "rooflight_client_request_errors": "the proxy's availability records: no pod runs `rooflight proxy` here",
}

HA_QUERIES = (
    "count by (cluster) (rooflight_engine_steps_total)",
    'count_over_time(rooflight_engine_steps_total{pod="llm-chat-a"}[1m])',
    'count({__replica__!=""})',
)

Labels = tuple[tuple[str, str], ...]


def _key(alert: Labels) -> tuple[str, str, str, str]:
    d = dict(alert)
    return d["alertname"], d.get("cluster", ""), d.get("namespace", ""), d["severity"]


@dataclass
class Run:
    """What the scenario saw, for the tests to judge."""

    replicas: dict[str, dict[str, float]] = field(default_factory=dict)  # agent -> {url: samples sent}
    vm_url: dict[str, str] = field(default_factory=dict)  # cluster -> its link's write URL to VictoriaMetrics
    ha: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)  # store -> query -> rows
    seen: dict[str, set[tuple[str, str, str, str]]] = field(default_factory=dict)  # ruler -> alerts ever firing
    notified: set[tuple[str, str, str, str]] = field(default_factory=set)  # what reached the Alertmanager
    absent_fired: dict[str, float] = field(default_factory=dict)  # ruler -> seconds into the cut it fired
    absent_resolved: dict[str, bool] = field(default_factory=dict)
    records: dict[str, dict[str, dict[Labels, float]]] = field(default_factory=dict)  # store -> record -> rows
    firing_end: dict[str, set[tuple[str, str, str, str]]] = field(default_factory=dict)
    dashboard: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = field(default_factory=dict)
    variables: dict[str, dict[tuple[str, str], set[str]]] = field(default_factory=dict)


def fleet_records() -> list[str]:
    return list(dict.fromkeys(r["record"] for g in groups(STAGE_CONFIG, "fleet") for r in g["rules"] if "record" in r))


def fleet_dashboard() -> dict[str, Any]:
    return json.loads((ROOT / "dashboards" / "json" / "rooflight-fleet.json").read_text(encoding="utf-8"))


def _rows(rows: list[dict[str, Any]]) -> dict[Labels, float]:
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1]) for r in rows}


def _watch(f: fs.Fleet, run: Run, until: float, cut_at: float | None) -> None:
    """Poll both rulers and the Alertmanager every POLL_S until the monotonic clock reaches `until`."""
    rulers = {"vmalert": f.vmalert, "prometheus": f.prometheus}
    while time.monotonic() < until:
        for name, ruler in rulers.items():
            firing = {_key(a) for a in f.firing(ruler)}
            run.seen.setdefault(name, set()).update(firing)
            absent = any(a[0] == CLUSTER_ALERT for a in firing)
            if absent and cut_at is not None and name not in run.absent_fired:
                run.absent_fired[name] = time.monotonic() - cut_at
            if cut_at is None and name in run.absent_fired:
                run.absent_resolved[name] = not absent
        run.notified |= {_key(a) for a in f.notified()}
        for running in f.running:
            assert running.proc.poll() is None, f"{running.pod} exited: {fs.stop_process(running.proc)[-2000:]}"
        time.sleep(POLL_S)


def _dashboard_rows(store: fs.Store, cluster: str, at: float | None = None, only_alerts: bool = False
                    ) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out = {}
    for title, ref, expr in exprs(fleet_dashboard()):
        if only_alerts != ("ALERTS" in metric_names(expr)):
            continue
        out[(f"{title}/{ref}", expr)] = store.query(fill(expr, cluster=cluster), at)
    return out


def _cut(f: fs.Fleet, run: Run) -> dict[str, dict[tuple[str, str], list[dict[str, Any]]]]:
    """Cut the CUT cluster's links to both stores for GAP_S, watching; mend them. Returns the fleet
    dashboard's Alerts row for that cluster on each store, read while its meta-alert fired."""
    for store in ("vm", "prometheus"):
        f.links[(CUT, store)].cut()
    cut_at = time.monotonic()
    absent_alerts: dict[str, dict[tuple[str, str], list[dict[str, Any]]]] = {}
    while time.monotonic() < cut_at + GAP_S:
        _watch(f, run, min(time.monotonic() + 30, cut_at + GAP_S), cut_at)
        fired = len(run.absent_fired) == 2 and time.monotonic() - cut_at > max(run.absent_fired.values()) + LATE_S
        if fired and not absent_alerts:
            absent_alerts = {"vm": _dashboard_rows(f.vm, CUT, only_alerts=True),
                             "prometheus": _dashboard_rows(f.prometheus, CUT, only_alerts=True)}
    for store in ("vm", "prometheus"):
        f.links[(CUT, store)].mend()
    return absent_alerts


def _read(f: fs.Fleet, run: Run, absent_alerts: dict[str, dict[tuple[str, str], list[dict[str, Any]]]]) -> None:
    """Everything the tests judge at the end: records, HA counts, firing alerts, the fleet dashboard."""
    at = time.time() - LATE_S
    for name, store in (("vm", f.vm), ("prometheus", f.prometheus), ("truth", f.truth)):
        run.records[name] = {r: _rows(store.query(f"avg_over_time({r}[{SMOOTH}])", at)) for r in fleet_records()}
        run.ha[name] = {q: store.query(q, at) for q in HA_QUERIES}
    run.replicas = {agent.name: f.sent_samples(agent) for agents in f.agents.values() for agent in agents}
    run.vm_url = {c: f"http://127.0.0.1:{f.links[(c, 'vm')].port}/api/v1/write" for c in f.clusters}
    for name, ruler in (("vmalert", f.vmalert), ("prometheus", f.prometheus), ("truth", f.truth)):
        run.firing_end[name] = {_key(a) for a in f.firing(ruler)}
    for name, store in (("vm", f.vm), ("prometheus", f.prometheus)):
        run.dashboard[name], run.variables[name] = {}, {}
        for cluster in f.clusters:
            rows = _dashboard_rows(store, cluster)
            rows |= absent_alerts.get(name, {}) if cluster == CUT else _dashboard_rows(store, cluster, only_alerts=True)
            run.dashboard[name] |= {(cluster, *k): v for k, v in rows.items()}
            for var, selector, label in query_variables(fleet_dashboard()):
                found = store.query(fill(selector, cluster=cluster))
                run.variables[name][(cluster, var)] = {r["metric"].get(label, "") for r in found}


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    missing = fs.missing_binaries()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (.ci/install installs them)")
    rules = tmp_path_factory.mktemp("rules")
    files = {}
    for scope in ("pod", "fleet", "all"):
        files[scope] = rules / f"{scope}.yaml"
        files[scope].write_text(render(STAGE_CONFIG, "yaml", scope), encoding="utf-8")
    for scope in ("pod", "fleet"):  # Debian 12's vmalert (1.79) refuses keep_firing_for: rendered without it
        files[f"vm-{scope}"] = rules / f"vm-{scope}.yaml"
        files[f"vm-{scope}"].write_text(render(replace(STAGE_CONFIG, keep_firing_for=""), "yaml", scope), encoding="utf-8")
    run = Run()
    with fs.Fleet(PODS, HA, files["pod"], files["fleet"], files["all"], GPU_HOUR_COST,
                  vmalert_rules=(files["vm-pod"], files["vm-fleet"])) as f:
        _watch(f, run, time.monotonic() + WARM_S, None)
        absent_alerts = _cut(f, run)
        _watch(f, run, time.monotonic() + SETTLE_S, None)
        _read(f, run, absent_alerts)
    yield run


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= RELATIVE * max(abs(a), abs(b)) + ABSOLUTE


def test_the_stage_config_changes_only_what_the_stage_needs() -> None:
    default = RulesConfig()
    assert replace(STAGE_CONFIG, ttft=default.ttft, capacity_window=default.capacity_window,
                   cluster_absent_for=default.cluster_absent_for) == default
    assert GAP_S >= 300 and fs.SCRAPE_S < 60
    # the per-cluster truth loads the rules whole; the central rulers load the two halves
    assert {r.get("record") or r.get("alert") for g in groups(STAGE_CONFIG) for r in g["rules"]} | {CLUSTER_ALERT} == {
        r.get("record") or r.get("alert") for s in ("pod", "fleet") for g in groups(STAGE_CONFIG, s) for r in g["rules"]}


def test_the_ha_pair_is_one_cluster_not_two(fleet_run: Run) -> None:
    # both replicas of the pair delivered to VictoriaMetrics, a scrape's worth of samples each and more
    east = [name for name in fleet_run.replicas if name.startswith(f"prometheus-{HA}-")]
    assert len(east) == 2
    for name in east:
        assert fleet_run.replicas[name].get(fleet_run.vm_url[HA], 0) > 1000, fleet_run.replicas
    pods = {c: sum(1 for p in PODS if p.cluster == c) for c in (HA, CUT)}
    for store, rows in fleet_run.ha.items():
        counts = {r["metric"]["cluster"]: float(r["value"][1]) for r in rows["count by (cluster) (rooflight_engine_steps_total)"]}
        assert counts == pods, (store, counts)  # one series per pod: the pair's __replica__ is gone
        assert rows['count({__replica__!=""})'] == [] or float(rows['count({__replica__!=""})'][0]["value"][1]) == 0, store
        # one sample per scrape interval of the pair, not two: VictoriaMetrics' dedup, one writer elsewhere
        per_minute = {r["metric"]["cluster"]: float(r["value"][1])
                      for r in rows['count_over_time(rooflight_engine_steps_total{pod="llm-chat-a"}[1m])']}
        assert set(per_minute) == {HA, CUT}, (store, per_minute)
        for cluster, samples in per_minute.items():
            assert abs(samples - 60 / fs.SCRAPE_S) <= 3, (store, per_minute)  # 30, where both replicas' are 60


def _young_rate(record: str) -> bool:
    """A plain rate record over a window longer than the stage has run: its series are younger than the window.
    MetricsQL's rate() divides by the span of the samples it has, PromQL's by the window, so VictoriaMetrics
    reads it higher (docs/deploy.md, Fleet); ratios of two such rates (the burn rows) agree either way."""
    m = re.search(r":rate(\d+)([mhd])$", record)
    return bool(m) and int(m.group(1)) * {"m": 60, "h": 3600, "d": 86400}[m.group(2)] > STAGE_S


def test_every_fleet_record_agrees_across_stores_and_with_each_clusters_truth(fleet_run: Run) -> None:
    truth, wrong = fleet_run.records["truth"], []
    answered = 0
    for record in fleet_records():
        want = truth[record]
        for store in ("vm", "prometheus"):
            got = fleet_run.records[store][record]
            if set(got) != set(want):
                wrong.append(f"{store} {record}: series {sorted(got)} != truth's {sorted(want)}")
                continue
            if store == "vm" and _young_rate(record):  # at least the truth's: never a guard met later
                wrong += [f"{store} {record}{dict(k)}: {got[k]:.6g} under truth {want[k]:.6g}"
                          for k in want if got[k] < want[k] * (1 - RELATIVE) - ABSOLUTE]
                continue
            wrong += [f"{store} {record}{dict(k)}: {got[k]:.6g} vs truth {want[k]:.6g}"
                      for k in want if not _close(got[k], want[k])]
        answered += bool(want)
        for labels in want:
            assert dict(labels)["cluster"] in (HA, CUT), (record, labels)
    for store in ("vm", "prometheus"):
        worst = max((abs(got - truth[r][k]) / max(abs(truth[r][k]), 1e-9), r, dict(k))
                    for r in fleet_records() if not (store == "vm" and _young_rate(r))
                    for k, got in fleet_run.records[store][r].items()
                    if k in truth[r] and abs(truth[r][k]) > 1e-6)
        print(f"{store}: {sum(len(v) for v in fleet_run.records[store].values())} fleet series, worst {worst[0]:.2%} "
              f"off the truth ({worst[1]} {worst[2]})")
    assert wrong == [], "\n".join(wrong)
    assert answered == len(fleet_records()), [r for r in fleet_records() if not truth[r]]


def test_sums_are_per_cluster_and_count_each_pod_once(fleet_run: Run) -> None:
    # What the pool's GPUs cost an hour is known exactly: 2.5 x one GPU x its pods. An HA pair counted
    # twice reads 10 for east/chat; a sum across clusters reads 12.5 for chat.
    for store in ("vm", "prometheus", "truth"):
        cost = {(dict(k)["cluster"], dict(k)["namespace"]): v
                for k, v in fleet_run.records[store]["model:rooflight_gpu_hour_cost:sum"].items()}
        assert cost == pytest.approx({(HA, "chat"): 5.0, (HA, "batch"): 2.5, (CUT, "chat"): 5.0}), (store, cost)
    # The fleet's tokens/s is the sum of the clusters' truths, and its hottest rank the max of theirs.
    for store in ("vm", "prometheus"):
        for record, combine in (("model_phase:rooflight_tokens:rate5m", sum), ("model_role:rooflight_saturation:max1m", max)):
            truths = fleet_run.records["truth"][record]
            got = fleet_run.records[store][record]
            assert _close(combine(got.values()), combine(truths.values())), (store, record, got, truths)


def test_the_same_alerts_fire_on_both_rulers_and_the_cut_cluster_pages_nothing(fleet_run: Run) -> None:
    # every ruler, and the Alertmanager both notify, saw exactly: the KV-wall pool's TTFT burn (critical)
    # and the meta-alert for the cluster that went silent (warning); the steady pools' near miss stays quiet
    assert fleet_run.seen["vmalert"] == fleet_run.seen["prometheus"] == EXPECTED_ALERTS, fleet_run.seen
    assert fleet_run.notified == EXPECTED_ALERTS, fleet_run.notified
    assert not any(a[1] == CUT and a[3] == "critical" for a in fleet_run.notified)
    # it fired within the cut, once about 2 m of silence had passed (not at the first missed sample), and
    # resolved when the backlog landed
    print("RooflightClusterAbsent fired " + ", ".join(f"{after:.0f} s into the cut on {ruler}"
                                                      for ruler, after in sorted(fleet_run.absent_fired.items())))
    for ruler, after in fleet_run.absent_fired.items():
        assert 90 <= after < GAP_S, (ruler, after)
    assert fleet_run.absent_resolved == {"vmalert": True, "prometheus": True}
    # at the end the truth (rules whole, no remote write) fires what both rulers fire, less their meta-alert
    burn = {a for a in EXPECTED_ALERTS if a[0] != CLUSTER_ALERT}
    assert fleet_run.firing_end["vmalert"] == fleet_run.firing_end["prometheus"] == fleet_run.firing_end["truth"] == burn


def test_every_fleet_dashboard_query_answers_per_cluster_on_both_stores(fleet_run: Run) -> None:
    empty, foreign = [], []
    for store, answers in fleet_run.dashboard.items():
        assert {k[0] for k in answers} == {HA, CUT}
        for (cluster, where, expr), rows in answers.items():
            if not rows:
                if not any(key in name for name in metric_names(expr) | record_names(expr) for key in ABSENT):
                    empty.append(f"{store} {cluster} {where}: {expr}")
                continue
            clusters = {r["metric"].get("cluster") for r in rows}
            if clusters != {cluster}:
                foreign.append(f"{store} {cluster} {where}: rows of {clusters}")
        alerts = {k for k in answers if "ALERTS" in metric_names(k[2])}
        assert {k[0] for k in alerts} == {HA, CUT} and all(answers[k] for k in alerts), store
    assert empty == [], "\n".join(empty)
    assert foreign == [], "\n".join(foreign)
    for store, offered in fleet_run.variables.items():
        for cluster in (HA, CUT):
            assert offered[(cluster, "namespace")] == {p.namespace for p in PODS if p.cluster == cluster}, store
            assert offered[(cluster, "pod")] == {p.name for p in PODS if p.cluster == cluster}, store
