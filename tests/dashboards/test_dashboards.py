"""Dashboards: fresh, schema-valid, well-formed, querying only metrics someone exports, and answered by Prometheus."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from rooflight.dashboards import generate
from rooflight.dashboards.metrics import (
    GPU_EXTRA,
    PROMETHEUS_BUILTINS,
    declared_rooflight_metrics,
    metric_names,
    pending_gpu_metrics,
)
from rooflight.dashboards.schemacheck import schema_errors
import promstack
from support import ROOT, SAMPLES

JSON_DIR = ROOT / "dashboards" / "json"
PROVISIONING = ROOT / "dashboards" / "provisioning"
SAMPLE_DIRS = (ROOT / "tests" / "fixtures" / "engine-samples", SAMPLES)

# Values the test gives Grafana's variables (All = ".*"); windows and SLOs are the fastest/defaults.
VARIABLES = {
    "$__rate_interval": "15s", "$__interval": "1s", "$__range": "1m",
    "$target": ".*", "$model": ".*", "$rank": ".*", "$gpu": ".*",
    "$window": "10s", "$dtype": "bf16", "$ttft_slo": "1.0", "$itl_slo": "0.1",
}


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(JSON_DIR.glob("*.json"))}


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs(d: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, refId, expr) for every query target."""
    for p in panels(d):
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]


def fill(expr: str) -> str:
    for name in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, VARIABLES[name])
    assert "$" not in expr, f"unfilled variable in {expr}"
    return expr


def engine_sample_names() -> set[str]:
    found: set[str] = set()
    for d in SAMPLE_DIRS:
        for f in sorted(d.glob("*.prom")) if d.is_dir() else []:
            for line in f.read_text(encoding="utf-8").splitlines():
                if line and not line.startswith("#"):
                    found.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return found


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


# -- structure and schema -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_validates_against_pinned_grafana_schema(name: str) -> None:
    assert schema_errors(dashboards()[name]) == []


def test_schema_check_catches_a_bad_panel() -> None:
    d = copy.deepcopy(dashboards()["rooflight-overview.json"])
    ts = next(p for p in d["panels"] if p["type"] == "timeseries")
    ts["options"]["legend"]["displayMode"] = "sideways"
    ts["gridPos"] = {"w": 12}
    errors = schema_errors(d)
    assert any("displayMode" in e or "sideways" in e for e in errors), errors
    assert any("gridPos" in e or "'h' is a required" in e for e in errors), errors


@pytest.mark.parametrize("name", sorted(generate.DASHBOARDS))
def test_shape_grafana_10_4_to_13_loads(name: str) -> None:
    d = dashboards()[name]
    assert d["schemaVersion"] == 39
    assert d["uid"] == name.removesuffix(".json")
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in ("target", "model", "rank"):
        assert variables[var]["type"] == "query" and variables[var]["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels(d):
        assert p["type"] in {"row", "timeseries", "stat", "xychart"}, "no Angular or unpinned panel types"
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


def test_descriptions_speak_the_seeds_vocabulary() -> None:
    text = " ".join(p.get("description", "") for d in dashboards().values() for p in panels(d)).lower()
    for word in ("prefill", "decode", "ridge", "intensity", "occupancy", "preempt", "mbu", "mfu",
                 "kernel residency", "head-of-line", "goodput", "batch"):
        assert word in text, word


# -- metric names -------------------------------------------------------------------------------------

def test_metric_names_are_extracted_from_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
            '{model_name=~"rooflight_not_a_metric"}[5m]))) / on (target) rooflight_mbu_ratio or ALERTS')
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket", "rooflight_mbu_ratio", "ALERTS"}
    assert metric_names("job:rooflight_x:rate1m") == set()


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
    with promstack.PromStack(targets=[]) as prom:
        for name, d in dashboards().items():
            for title, ref, expr in exprs(d):
                prom.query(fill(expr))  # raises PromError on a parse or evaluation error
            for v in d["templating"]["list"]:
                q = str(v.get("query", ""))
                m = re.fullmatch(r"label_values\((.+), *\w+\)", q)
                if v["type"] == "query" and m:
                    prom.query(fill(m.group(1)))


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
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


# Metrics allowed to be absent on the steady demo, each with the reason (None = "source does not say").
ABSENT_ON_STEADY_DEMO = {
    "ALERTS": "no rules are loaded here, and no Rooflight alert would fire on the steady scenario",
}


@pytest.mark.prometheus
@needs_prometheus
def test_every_query_returns_data_from_the_demo() -> None:
    agent_port, engine_port = promstack.free_port(), promstack.free_port()
    demo = subprocess.Popen(
        [shutil.which("rooflight") or "rooflight", "demo", "--listen", f"127.0.0.1:{agent_port}",
         "--engine-listen", f"127.0.0.1:{engine_port}", "--scenario", "steady"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        with promstack.PromStack([f"127.0.0.1:{agent_port}", f"127.0.0.1:{engine_port}"]) as prom:
            prom.wait_for("rooflight_mbu_ratio", timeout=60)
            time.sleep(20)  # enough samples for 15 s rates and the agent's 10 s windows
            pending = pending_gpu_metrics()
            empty = []
            for name, d in dashboards().items():
                for title, ref, expr in exprs(d):
                    if metric_names(expr) & (pending | set(ABSENT_ON_STEADY_DEMO)):
                        continue
                    if not prom.query(fill(expr)):
                        empty.append(f"{name}/{title}/{ref}: {fill(expr)}")
            assert empty == [], "\n".join(empty)
    finally:
        demo.send_signal(signal.SIGTERM)
        try:
            demo.wait(timeout=10)
        except subprocess.TimeoutExpired:
            demo.kill()
            demo.wait(timeout=5)
