"""Dashboards: fresh, well-formed, querying only metrics someone exports, and answered by Prometheus."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from rooflight.agent.signals.detectors import DetectorThresholds
from rooflight.dashboards import generate, panels as conventions
from rooflight.agent.proxy import catalog as client_catalog
from rooflight.dashboards.metrics import (
    GPU_EXTRA,
    PROMETHEUS_BUILTINS,
    declared_client_metrics,
    declared_rooflight_metrics,
    metric_names,
    pending_gpu_metrics,
    record_names,
)
from rooflight.rules.config import TOPOLOGY_LABELS
import promstack
from demo_procs import stop_process
from dashboard_queries import dashboards, exprs, fill, panels, query_variables
from support import ROOT, SAMPLES

PROVISIONING = ROOT / "dashboards" / "provisioning"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
SAMPLE_DIRS = (ROOT / "tests" / "fixtures" / "engine-samples", SAMPLES)


def engine_sample_names() -> set[str]:
    found: set[str] = set()
    for d in SAMPLE_DIRS:
        for f in sorted(d.glob("*.prom")) if d.is_dir() else []:
            for line in f.read_text(encoding="utf-8").splitlines():
                if line and not line.startswith("#"):
                    found.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return found


def shipped_records() -> set[str]:
    """The recording rules rules/rooflight.rules.yaml ships."""
    doc = yaml.safe_load((ROOT / "rules" / "rooflight.rules.yaml").read_text(encoding="utf-8"))
    return {rule["record"] for group in doc["groups"] for rule in group["rules"] if "record" in rule}


def rule_exprs() -> Iterator[tuple[str, str]]:
    for f in sorted((ROOT / "rules").rglob("*.y*ml")):
        doc = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
        spec = doc.get("spec", doc) if isinstance(doc, dict) else {}
        for group in spec.get("groups", []) if isinstance(spec, dict) else []:
            for rule in group.get("rules", []):
                yield f"{f.name}:{rule.get('alert') or rule.get('record')}", str(rule.get("expr", ""))


# -- generation ---------------------------------------------------------------------------------------

def test_checked_in_json_matches_the_generator() -> None:
    assert generate.stale() == [], "run: python -m rooflight.dashboards.generate"
    assert set(dashboards()) == set(generate.DASHBOARDS)


def test_check_mode_fails_on_stale_missing_or_extra_files(tmp_path: Path) -> None:
    generate.write_all(tmp_path)
    assert generate.main(["--check", "--out", str(tmp_path)]) == 0
    f = tmp_path / "rooflight-overview.json"
    f.write_text(f.read_text().replace("TTFT", "TTFX", 1))
    assert generate.main(["--check", "--out", str(tmp_path)]) == 1
    generate.write_all(tmp_path)
    (tmp_path / "rooflight-roofline.json").unlink()
    assert generate.stale(tmp_path) == ["rooflight-roofline.json"]
    generate.write_all(tmp_path)
    (tmp_path / "old.json").write_text("{}")
    assert generate.stale(tmp_path) == ["old.json"]


def test_generation_is_deterministic() -> None:
    assert generate.render_all() == generate.render_all()


# -- structure -----------------------------------------------------------------------------------------
# The type check against Grafana's TypeScript types (dashboards/validate.sh) is tested in test_panel_types.py.

@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_shape_grafana_10_4_to_13_loads(name: str) -> None:
    d = dashboards()[name]
    assert d["schemaVersion"] == 39
    assert d["uid"] == name.removesuffix(".json")
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in CHAIN:
        assert variables[var]["type"] == "query" and variables[var]["datasource"]["uid"] == "${datasource}"
        assert variables[var]["includeAll"] and variables[var]["allValue"] == ".*", var
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels(d):
        assert p["type"] in {"row", "timeseries", "stat", "xychart", "table"}, "no Angular or unpinned panel types"
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert len(p.get("description", "")) >= 80, f"{p['title']}: say how to read it"
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]


def test_descriptions_speak_the_physics_vocabulary() -> None:
    text = " ".join(p.get("description", "") for d in dashboards().values() for p in panels(d)).lower()
    for word in ("prefill", "decode", "ridge", "intensity", "occupancy", "preempt", "mbu", "mfu",
                 "kernel residency", "head-of-line", "goodput", "batch", "tail inflation", "prefix-cache",
                 "queue time", "dram bandwidth", "per pod"):
        assert word in text, word


# -- selection: topology variables, chained; every query filtered; the pod kept and named -------------

# The query variables in the order each one's values are filtered by the ones before it.
CHAIN = ("cluster", "namespace", "job", "pod", "instance", "target", "model", "rank")
# Aggregations that drop the pod on purpose: (dashboard, panel title) and why.
SINGLE_SERIES = {
    ("rooflight-overview.json", "Firing Rooflight alerts"): "one row per alert: the pod a label, not a series",
    ("rooflight-roofline.json", "Decode intensity vs batch"): "x and y joined on time: one series each",
}
_SELECTOR = re.compile(r"(?<![A-Za-z0-9_:\"'])([a-z][a-z0-9_]*:rooflight_[a-z0-9_]+:[a-z0-9_]+"
                       r"|rooflight_[a-z0-9_]+|vllm:[a-z0-9_:]+|sglang:[a-z0-9_:]+|ALERTS"
                       r"|up(?=\{))"
                       r"(?![A-Za-z0-9_:])(\{[^}]*\})?")
_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count|group)\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def _matcher(label: str) -> str:
    return f'{label}=~"${label}"'


def _service_level(metric: str) -> bool:
    """A recording rule summed over replicas (no pod): its level names no target."""
    return ":rooflight_" in metric and not metric.startswith("target")


def _through_agents(expr: str) -> bool:
    """Kept to the selected agents' services by service() or fleet()."""
    return any(expr.endswith(helper("x").removeprefix("(x)")) for helper in (conventions.service, conventions.fleet))


def test_topology_labels_are_the_rules_ones() -> None:
    assert set(conventions.SCRAPE_LABELS) == set(TOPOLOGY_LABELS)
    assert set(conventions.POD_LABELS) < set(conventions.SCRAPE_LABELS)


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_variables_are_chained(name: str) -> None:
    d = dashboards()[name]
    found = query_variables(d)
    order = [v for v, _, _ in found if v in CHAIN]
    assert order == list(CHAIN)
    for var, selector, label in found:
        assert label == var
        before = CHAIN[: CHAIN.index(var)] if var in CHAIN else ()
        if var == "gpu":  # GPU series carry the scrape labels, not target/model/rank
            before = tuple(conventions.SCRAPE_LABELS)
        if var == "dtype":
            before = (*conventions.SCRAPE_LABELS, "target")
        assert all(_matcher(b) in selector for b in before), f"{var}: {selector} is not filtered by {before}"
        assert _matcher(var) not in selector, f"{var} filters itself"


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_every_series_is_filtered_by_the_selection(name: str) -> None:
    scrape = [_matcher(label) for label in conventions.SCRAPE_LABELS]
    pod = [_matcher(label) for label in conventions.POD_LABELS]
    for title, ref, expr in exprs(dashboards()[name]):
        selectors = _SELECTOR.findall(expr)
        assert selectors, f"{title}/{ref}: no metric in {expr}"
        for metric, braces in selectors:
            where = f"{title}/{ref}: {metric}{braces}"
            if metric == "ALERTS":
                assert braces.startswith("{" + conventions.ALERT), where
            elif _service_level(metric):  # summed over replicas: by where it runs, the rest through the agents
                assert braces == "{" + (conventions.SERVICE if metric.startswith("model_name:")
                                        else conventions.FLEET) + "}", where
                assert _through_agents(expr), f"{where}: not through service() or fleet()"
            elif metric.startswith("rooflight_") or metric == "up" or ":rooflight_" in metric:
                assert all(m in braces for m in scrape), where
            else:  # the engine's own series: by pod here, by the agent's variables through native()
                assert all(m in braces for m in pod) and 'model_name=~"$model"' in braces, where
                assert expr.endswith(conventions.native("x").removeprefix("(x)")), f"{where}: not through native()"


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_aggregations_keep_the_pod_and_legends_name_it(name: str) -> None:
    d = dashboards()[name]
    for p in panels(d):
        if p["type"] == "row":
            continue
        single = (name, p["title"]) in SINGLE_SERIES
        for t in p["targets"]:
            where = f"{p['title']}/{t['refId']}"
            for op, mode, labels in _AGGREGATION.findall(t["expr"]):
                kept = {label.strip() for label in labels.split(",")}
                if mode == "by":
                    assert set(conventions.POD_LABELS) <= kept, f"{where}: {op} by ({labels}) drops the pod"
                elif mode == "without":
                    assert not kept & set(conventions.SCRAPE_LABELS), f"{where}: {op} without ({labels})"
                else:
                    assert single, f"{where}: {op}(...) drops the pod"
            if p["type"] in ("timeseries", "stat") and not single:
                if _through_agents(t["expr"]):  # a service-level record: no pod, the service and model named
                    assert "{{namespace}}" in t["legendFormat"] and re.search(r"\{\{model(_name)?\}\}", t["legendFormat"]), where
                else:
                    assert "{{pod}}" in t["legendFormat"], f"{where}: the legend does not name the pod"


def test_the_selector_check_catches_a_missing_filter() -> None:
    assert not all(_matcher(label) in "{" + conventions.POD + "}" for label in conventions.SCRAPE_LABELS)
    [(metric, braces)] = _SELECTOR.findall('sum by (pod) (rooflight_mbu_ratio{window="1m"})')
    assert metric == "rooflight_mbu_ratio" and _matcher("pod") not in braces
    assert _AGGREGATION.findall("max(x) + sum by (le) (y) + max_over_time(z[1m])") == [
        ("max", "", ""), ("sum", "by", "le")]
    # a record summed over replicas must go through service() or fleet(); a per-replica one is filtered as ours
    [(record, _)] = _SELECTOR.findall('model:rooflight_mbu:ratio_rate5m{cluster=~"$cluster"} / 2')
    assert _service_level(record) and not _through_agents(f"{record} / 2")
    assert _through_agents(conventions.fleet(record)) and _through_agents(conventions.service(record))
    assert not _service_level("target:rooflight_client_request_errors:ratio_rate5m")


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_links_carry_the_selection_to_the_other_dashboards(name: str) -> None:
    d = dashboards()[name]
    assert "rooflight" in d["tags"]
    [link] = d["links"]
    assert link["type"] == "dashboards" and link["tags"] == ["rooflight"]
    assert link["includeVars"] and link["keepTime"] and "placement" not in link
    assert all("rooflight" in other["tags"] for other in dashboards().values())  # the link finds every one


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_firing_alerts_are_overlaid_on_the_time_series(name: str) -> None:
    [anno] = dashboards()[name]["annotations"]["list"]
    assert anno["enable"] and anno["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    assert anno["target"]["expr"] == f'ALERTS{{{conventions.ALERT}, alertstate="firing"}}'
    assert "{{alertname}}" in anno["titleFormat"] and "{{pod}}" in anno["textFormat"]
    assert "pod" in anno["tagKeys"].split(",") and "placement" not in anno


def _rows(d: dict) -> dict[str, list[dict]]:
    """Row title -> the panels under it."""
    rows: dict[str, list[dict]] = {}
    current = ""
    for p in d["panels"]:
        if p["type"] == "row":
            current = p["title"]
        else:
            rows.setdefault(current, []).append(p)
    return rows


def test_head_of_line_panels_sit_side_by_side_with_the_detector_thresholds() -> None:
    d = dashboards()["rooflight-overview.json"]
    rows = _rows(d)
    hol = {p["title"]: p for p in rows["Head-of-line blocking"]}
    assert set(hol) == {"ITL p50 / p99 (agent, 10 s window)", "Prefill tokens per step (10 s)",
                        "ITL tail inflation ratio", "Head-of-line detector"}
    defaults = DetectorThresholds()

    def lines(title: str) -> list[float]:
        steps = hol[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return [s["value"] for s in steps if s["value"] is not None]

    assert lines("ITL tail inflation ratio") == [defaults.hol_inflation]
    assert lines("Prefill tokens per step (10 s)") == [defaults.hol_min_prefill_tokens_per_step]
    assert "rooflight_itl_tail_inflation" in hol["ITL tail inflation ratio"]["targets"][0]["expr"]
    assert "rooflight_head_of_line_blocking" in hol["Head-of-line detector"]["targets"][0]["expr"]


def test_engine_facts_come_from_the_agent_not_the_engines_own_series() -> None:
    """Prefix-cache hit rate, request lengths and queue time read the agent's rooflight_* series (one
    definition for every engine, windowed like TTFT); the engine's settings are a table of its info metric."""
    by_title = {p["title"]: p for d in dashboards().values() for p in panels(d) if p["type"] != "row"}
    wanted = {
        "Prefix-cache hit rate": {"rooflight_prefix_cache_hit_ratio"},
        "Prompt length p50 / p90 / p99": {"rooflight_request_prompt_tokens"},
        "Output length p50 / p90 / p99": {"rooflight_request_output_tokens"},
    }
    for title, metrics in wanted.items():
        used = set().union(*(metric_names(t["expr"]) for t in by_title[title]["targets"]))
        assert used == metrics, title
        assert all('window="$window"' in t["expr"] for t in by_title[title]["targets"]), title
    queue = by_title["Queue time vs prefill time"]["targets"]
    assert metric_names(queue[0]["expr"]) == {"rooflight_request_queue_time_seconds"}
    settings = by_title["Engine settings"]
    assert settings["type"] == "table"
    [target] = settings["targets"]
    assert metric_names(target["expr"]) == {"rooflight_engine_config_info"}
    assert target["instant"] and target["format"] == "table"
    [organize] = settings["transformations"]
    assert organize["id"] == "organize" and {"Time", "Value", "__name__"} <= set(organize["options"]["excludeByName"])
    for title in ("Prefix-cache hit rate", "Engine settings"):
        assert not any(m.startswith(("vllm:", "sglang:")) for t in by_title[title]["targets"] for m in metric_names(t["expr"]))


def test_client_row_sets_the_clients_view_beside_the_engines() -> None:
    """Each comparison panel draws the proxy's percentile and the engine's, the same window and percentiles;
    the gap panel subtracts them matched on the agent, target, window and percentile."""
    row = {p["title"]: p for p in _rows(dashboards()["rooflight-overview.json"])["Client vs engine (rooflight proxy)"]}
    assert set(row) == {"TTFT: client vs engine p50 / p99", "ITL: client vs engine p50 / p99",
                        "TTFT the engine does not see (client - engine)", "Client goodput by SLO",
                        "Client requests by finish reason"}
    for title, ours, theirs in (("TTFT: client vs engine p50 / p99", client_catalog.TTFT, "rooflight_ttft_seconds"),
                                ("ITL: client vs engine p50 / p99", client_catalog.ITL, "rooflight_itl_seconds")):
        client, engine = (t["expr"] for t in row[title]["targets"])
        assert metric_names(client) == {ours} and metric_names(engine) == {theirs}, title
        for expr in (client, engine):
            assert 'window="$window"' in expr and 'percentile=~"50|99"' in expr, expr
    gap = row["TTFT the engine does not see (client - engine)"]["targets"][0]["expr"]
    assert metric_names(gap) == {client_catalog.TTFT, "rooflight_ttft_seconds"}
    on = re.search(r"- on \(([^)]*)\)", gap)
    assert on, gap
    assert {x.strip() for x in on.group(1).split(",")} == {"target", "window", "percentile", *conventions.SCRAPE_LABELS}
    assert metric_names(row["Client goodput by SLO"]["targets"][0]["expr"]) == {client_catalog.GOODPUT_RATIO}
    assert 'route!="other"' in row["Client requests by finish reason"]["targets"][0]["expr"]


def test_the_proxys_metrics_are_known_as_promql_selects_them() -> None:
    known = declared_client_metrics()
    assert known <= declared_rooflight_metrics()
    for d in client_catalog.CATALOG:
        if d.type == "histogram":
            assert {d.name + "_bucket", d.name + "_sum", d.name + "_count"} <= known and d.name not in known
        else:
            assert d.name in known
    assert {n for n in known if not n.startswith(client_catalog.PREFIX)} == set()


# -- runbooks name the panels that show what they ask to look at ---------------------------------------

# A panel is cited as `panel "title" (dashboard)`, or in a list `"title" (dashboard)`; text is compared with its
# line breaks and indentation collapsed, so a title may wrap.
_PANEL_REF = re.compile(r'"([^"]+)" \(([^)]+)\)')
# Alerts whose first step is not a measurement: why.
NO_PANEL_TO_MEASURE = {
    "RooflightSLOBucketMissing": "a rule-configuration check: the fix is a threshold on a bucket edge",
}


def _flat(text: str) -> str:
    return " ".join(text.split())


def _runbook_sections() -> dict[str, str]:
    text = RUNBOOKS.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_runbooks_name_panels_that_exist() -> None:
    titles = {d["title"]: {p["title"] for p in panels(d)} for d in dashboards().values()}
    refs = _PANEL_REF.findall(_flat(RUNBOOKS.read_text(encoding="utf-8")))
    assert len(refs) >= 10
    for panel, board in refs:
        assert f"Rooflight / {board}" in titles, f'no dashboard "Rooflight / {board}" (panel "{panel}")'
        assert panel in titles[f"Rooflight / {board}"], f'no panel "{panel}" on {board}'


def test_every_alert_runbook_measures_on_a_panel() -> None:
    sections = {k: v for k, v in _runbook_sections().items() if k.startswith("Rooflight")}
    assert len(sections) >= 8
    for alert, body in sections.items():
        steps = body.split("**What to do.**", 1)[1]
        first = re.split(r"^2\. ", steps, flags=re.M)[0]
        if alert in NO_PANEL_TO_MEASURE:
            continue
        assert _PANEL_REF.search(_flat(first)), f"{alert}: the first step names no panel"


def test_tail_inflation_has_one_definition() -> None:
    """The code's definition (agent/signals: worst ITL since the previous sample / its recent median) in the docs."""
    formulas = METRICS_DOC.read_text(encoding="utf-8").split("## Reference", 1)[0]
    runbook = _runbook_sections()["RooflightHeadOfLineBlocking"]
    overview = next(p for p in panels(dashboards()["rooflight-overview.json"])
                    if p["title"] == "ITL tail inflation ratio")
    for where, text in (("docs/metrics.md", formulas), ("docs/runbooks.md", runbook),
                        ("overview panel", overview["description"])):
        flat = _flat(text)
        assert "rooflight_itl_tail_inflation" in flat, where
        assert "worst ITL since the" in flat and "median" in flat, where
        assert "p50 ITL over the longest" not in flat, where


# -- metric names -------------------------------------------------------------------------------------

def test_metric_names_are_extracted_from_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
            '{model_name=~"rooflight_not_a_metric"}[5m]))) / on (target) rooflight_mbu_ratio or ALERTS')
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "rooflight_mbu_ratio", "ALERTS"}
    assert metric_names("job:rooflight_x:rate1m") == set()
    assert metric_names('up{job="a"} and on (up) group by (up) (rooflight_build_info)') == {"up", "rooflight_build_info"}


def test_every_queried_metric_is_exported_by_the_agent_or_an_engine() -> None:
    engine = engine_sample_names()
    assert any(n.startswith("vllm:") for n in engine), f"no engine samples found in {SAMPLE_DIRS}"
    known = declared_rooflight_metrics() | set(GPU_EXTRA.values()) | engine | PROMETHEUS_BUILTINS
    used: dict[str, str] = {}
    for name, d in dashboards().items():
        for title, ref, expr in exprs(d):
            used.update({m: f"{name}/{title}/{ref}" for m in metric_names(expr)})
        for v in d["templating"]["list"]:
            used.update({m: f"{name}/variable {v['name']}" for m in metric_names(str(v.get("query", "")))})
    for where, expr in rule_exprs():
        used.update({m: f"rules/{where}" for m in metric_names(expr)})
    unknown = {m: where for m, where in used.items() if m not in known}
    assert unknown == {}
    assert len(used) > 25


def test_record_names_are_extracted_from_promql() -> None:
    expr = ('(model_name:rooflight_ttft_slo_errors:ratio_rate5m{model_name=~"x:rooflight_y:z"} / 0.01) and on '
            '(cluster) rooflight_requests_running + job:rooflight_x:rate1m')
    assert record_names(expr) == {"model_name:rooflight_ttft_slo_errors:ratio_rate5m", "job:rooflight_x:rate1m"}
    assert record_names("rooflight_mbu_ratio + vllm:num_requests_running") == set()


def test_every_record_a_panel_reads_is_a_shipped_rule() -> None:
    """A panel reading a recording rule reads one rules/rooflight.rules.yaml records (a renamed record fails here)."""
    shipped = shipped_records()
    used: dict[str, str] = {}
    for name, d in dashboards().items():
        for title, ref, expr in exprs(d):
            used.update({r: f"{name}/{title}/{ref}" for r in record_names(expr)})
    assert {r: where for r, where in used.items() if r not in shipped} == {}
    # the fleet records (kept per cluster, namespace and job), the SLO records and the availability records
    for level in ("model:", "model_phase:", "model_role:", "model_name:"):
        assert any(r.startswith(level) for r in used), level


def test_extra_gpu_gauges_are_exported_by_the_agent() -> None:
    assert pending_gpu_metrics() == set()


# -- provisioning -------------------------------------------------------------------------------------

def test_provisioning_folder_is_mountable_as_is() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "rooflight.yaml").read_text())
    assert ds["apiVersion"] == 1
    [source] = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "rooflight.yaml").read_text())
    [provider] = prov["providers"]
    assert provider["type"] == "file" and Path(provider["options"]["path"]).is_absolute()
    readme = (PROVISIONING / "README.md").read_text()
    assert f'dashboards/json:{provider["options"]["path"]}' in readme
    assert "dashboards/provisioning:/etc/grafana/provisioning" in readme


# -- real Prometheus ----------------------------------------------------------------------------------

needs_prometheus = pytest.mark.skipif(not promstack.available(), reason="Debian's prometheus is not installed")


@pytest.mark.prometheus
@needs_prometheus
def test_every_query_parses_and_evaluates_in_prometheus() -> None:
    checked = 0
    with promstack.PromStack(targets=[]) as prom:
        for name, d in dashboards().items():
            for title, ref, expr in exprs(d):
                prom.query(fill(expr))  # raises PromError on a parse or evaluation error
                checked += 1
            for _, selector, _ in query_variables(d):
                prom.query(fill(selector))
                checked += 1
    assert checked >= len(dashboards()), "no dashboard query was found to check"


@pytest.mark.prometheus
@needs_prometheus
def test_promstack_scrapes_and_stops_cleanly(tmp_path: Path) -> None:
    (tmp_path / "metrics").write_text("rooflight_build_info{version=\"t\"} 1\n")
    port = promstack.free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rule = tmp_path / "r.yaml"
    rule.write_text("groups: [{name: t, rules: [{record: 'job:rooflight_build_info:max', "
                    "expr: 'max by (job) (rooflight_build_info)'}]}]\n")
    try:
        with promstack.PromStack([f"127.0.0.1:{port}"], [rule]) as prom:
            assert prom.wait_for("rooflight_build_info == 1")[0]["metric"]["version"] == "t"
            assert prom.wait_for("job:rooflight_build_info:max")[0]["value"][1] == "1"
            with pytest.raises(promstack.PromError, match="parse error"):
                prom.query("sum(")
            pid, data = prom.proc.pid if prom.proc else 0, prom.dir
        assert data is not None and not data.exists()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        stop_process(server)


# -- the SLO variables default to the alerts' thresholds -----------------------------------------------

def test_slo_variables_default_to_the_rules_thresholds() -> None:
    """The overview's TTFT and ITL SLO variables start where RooflightTTFTBudgetBurn and RooflightITLBudgetBurn
    judge (rules/config.py), spelled as the engine spells the bucket edge, and offer only bucket edges."""
    from rooflight.collectors.vllm import ITL_EDGES as VLLM_ITL_BUCKETS, TTFT_EDGES as VLLM_TTFT_BUCKETS
    from rooflight.rules.config import RulesConfig

    config = RulesConfig()
    variables = {v["name"]: v for v in dashboards()["rooflight-overview.json"]["templating"]["list"]}
    for name, slo, edges in (("ttft_slo", config.ttft, VLLM_TTFT_BUCKETS), ("itl_slo", config.itl, VLLM_ITL_BUCKETS)):
        var = variables[name]
        assert float(var["current"]["value"]) == slo.threshold_seconds, name
        offered = [o["value"] for o in var["options"]]
        assert var["current"]["value"] in offered and [o["value"] for o in var["options"] if o["selected"]] == [
            var["current"]["value"]], name
        assert all(float(v) in edges and v == repr(float(v)) for v in offered), (name, offered)


# -- operations: capacity, SLO burn, fleet, cost, speculative decoding, KV transfer --------------------

def _panel_metrics(p: dict) -> set[str]:
    return set().union(*(metric_names(t["expr"]) | record_names(t["expr"]) for t in p["targets"]))


def test_capacity_row_shows_the_autoscalers_input_per_pod() -> None:
    row = {p["title"]: p for p in _rows(dashboards()["rooflight-overview.json"])["Capacity (the autoscaler's input)"]}
    assert _panel_metrics(row["Saturation by role"]) == {"rooflight_saturation_ratio"}
    assert _panel_metrics(row["Headroom by resource"]) == {"rooflight_headroom_ratio"}
    assert _panel_metrics(row["Predicted capacity vs load"]) == {"rooflight_capacity_requests_per_second",
                                                                  "rooflight_requests_per_second"}
    assert _panel_metrics(row["Binding resource"]) == {"rooflight_saturation_binding_info"}
    for p in row.values():
        assert all('window="$window"' in t["expr"] for t in p["targets"]), p["title"]
    steps = row["Saturation by role"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps if s["value"] is not None] == [1.0]  # the first wall


def _burn_panels(name: str) -> dict[str, dict]:
    return {p["title"]: p for p in _rows(dashboards()[name])["SLO burn rate and error budget"]}


def test_slo_row_shows_each_alerts_ratio_per_window_over_its_budget() -> None:
    """Each burn panel divides the record of every burn window by the budget its alert uses (rules/config.py),
    and marks the lowest paging factor; the error budget panel reads the longest window."""
    from rooflight.rules import availability, slo
    from rooflight.rules.config import RulesConfig

    config = RulesConfig()
    windows = slo.slo_windows(config)
    wanted = {
        "Burn rate: TTFT": (lambda w: slo.error_record(config, config.ttft, w), config.ttft.budget),
        "Burn rate: ITL": (lambda w: slo.error_record(config, config.itl, w), config.itl.budget),
        "Burn rate: engine availability": (lambda w: availability.request_record(config, w),
                                           1 - config.request_error_objective),
        "Burn rate: client availability": (lambda w: availability.client_record(config, w),
                                           1 - config.client_error_objective),
    }
    row = _burn_panels("rooflight-overview.json")
    for title, (record, budget) in wanted.items():
        targets = row[title]["targets"]
        assert [record_names(t["expr"]) for t in targets] == [{record(w)} for w in windows], title
        for t, w in zip(targets, windows):
            assert re.search(rf"\}} / {re.escape(f'{budget:.10g}')}\)?( and |$)", t["expr"]), (title, t["expr"])
            assert t["legendFormat"].endswith(f" {w}"), title
        lines = [s["value"] for s in row[title]["fieldConfig"]["defaults"]["thresholds"]["steps"] if s["value"]]
        assert lines == [1.0, min(r.factor for r in config.burn_windows if r.severity == "critical")], title
    left = row[f"Error budget left ({windows[-1]} window)"]
    assert [record_names(t["expr"]) for t in left["targets"]] == [{record(windows[-1])} for record, _ in wanted.values()]


def test_shared_panels_are_the_same_on_every_dashboard_that_shows_them() -> None:
    """The SLO row and the alert list are written once (dashboards/shared.py): equal but for id and place."""
    def strip(p: dict) -> dict:
        return {k: v for k, v in p.items() if k not in ("id", "gridPos")}

    for title in _burn_panels("rooflight-overview.json"):
        assert strip(_burn_panels("rooflight-overview.json")[title]) == strip(_burn_panels("rooflight-fleet.json")[title])
    alerts = [strip(p) for d in dashboards().values() for p in panels(d) if p["title"] == "Active Rooflight alerts"]
    assert len(alerts) == 2 and alerts[0] == alerts[1]


def test_fleet_dashboard_reads_the_fleet_records_and_the_cost_signals() -> None:
    board = dashboards()["rooflight-fleet.json"]
    used = set().union(*(_panel_metrics(p) for p in panels(board) if p["type"] != "row"))
    for level in ("model:", "model_phase:", "model_role:"):
        assert any(r.startswith(level) for r in used), level
    assert {"rooflight_cost_per_million_tokens", "rooflight_blended_cost_per_million_tokens",
            "rooflight_gpu_time_share_ratio", "model_phase:rooflight_cost_per_million_tokens:rate5m",
            "model:rooflight_gpu_hour_cost:sum", "model_role:rooflight_saturation:max1m",
            "model_role:rooflight_saturation:avg1m", "model_phase:rooflight_groups_needed:rate5m"} <= used


def test_speculative_decoding_and_kv_transfer_families_are_on_a_panel() -> None:
    """Every spec-decode and KV-transfer family the agent's catalog declares is shown somewhere."""
    from rooflight.agent.metrics.catalog import all_defs

    families = {d.name for d in all_defs() if d.name.startswith(("rooflight_spec_decode", "rooflight_kv_transfer"))}
    assert len(families) >= 5
    shown = set().union(*(_panel_metrics(p) for d in dashboards().values() for p in panels(d) if p["type"] != "row"))
    assert families - shown == set()
