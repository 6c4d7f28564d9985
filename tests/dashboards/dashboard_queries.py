"""The checked-in dashboards as the tests read them: panels, every query they run, and Grafana's variables filled in.

Shared by test_dashboards.py and test_dashboards_e2e.py (imported as a sibling module).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from support import ROOT

JSON_DIR = ROOT / "dashboards" / "json"

# Values the tests give Grafana's variables (All = ".*"); windows and SLOs are the fastest/defaults.
VARIABLES = {
    "$__rate_interval": "15s", "$__interval": "1s", "$__range": "1m",
    "$cluster": ".*", "$namespace": ".*", "$job": ".*", "$pod": ".*", "$instance": ".*",
    "$target": ".*", "$model": ".*", "$rank": ".*", "$gpu": ".*",
    "$window": "10s", "$dtype": "bf16", "$ttft_slo": "2.5", "$itl_slo": "0.1",
}
_LABEL_VALUES = re.compile(r"label_values\((.+), *(\w+)\)")


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(JSON_DIR.glob("*.json"))}


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs(d: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(panel title, refId, expr) for every query target, and ("annotation <name>", refId, expr) for annotations."""
    for p in panels(d):
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]
    for a in d.get("annotations", {}).get("list", []):
        if "target" in a:
            yield f"annotation {a['name']}", a["target"]["refId"], a["target"]["expr"]


def query_variables(d: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, selector expression, label) of every `label_values(expr, label)` query variable, in order."""
    out = []
    for v in d["templating"]["list"]:
        m = _LABEL_VALUES.fullmatch(str(v.get("query", "")))
        if v["type"] == "query" and m:
            out.append((v["name"], m.group(1), m.group(2)))
    return out


def fill(expr: str, **values: str) -> str:
    """The expression as Grafana would send it, every variable at VARIABLES' value unless given (`pod="x"`)."""
    given = {**VARIABLES, **{f"${name}": value for name, value in values.items()}}
    for name in sorted(given, key=len, reverse=True):
        expr = expr.replace(name, given[name])
    assert "$" not in expr, f"unfilled variable in {expr}"
    return expr
