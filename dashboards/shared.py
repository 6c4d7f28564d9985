"""Panels more than one dashboard shows, written once: the SLO burn row and the list of active alerts.

The SLO row reads the recording rules of rules/ (their names come from the rule modules' own builders, and
the objectives and burn windows from RulesConfig), so a panel shows exactly the ratio an alert judges:
burn rate = error ratio / (1 - objective), the factor RulesConfig.burn_windows compares with. The engine's
SLOs (TTFT, ITL, availability) are the service's: summed over replicas, one series per service and model
(`service()`); the proxy's availability is per replica and target, as its rules are.
"""

from __future__ import annotations

from typing import Any, Callable

from rooflight.rules import availability, slo
from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import number

from .panels import ALERT, CLIENT, SERVICE, SERVICE_WHO, Grid, query, sel, service, ts

RULES = RulesConfig()
_WINDOWS = slo.slo_windows(RULES)  # every window a burn row reads, shortest first
_LONGEST = _WINDOWS[-1]
_REFS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Lines on the burn panels: 1 spends the budget exactly over its period; the lowest paging factor pages.
_PAGE = min(row.factor for row in RULES.burn_windows if row.severity == "critical")
_BURN_LINES = [(None, "transparent"), (1.0, "orange"), (_PAGE, "red")]


def _burn(record: Callable[[str], str], selector: str, budget: float, who: str, *, per_service: bool) -> list[Any]:
    """One query per burn window: the window's error ratio over the budget."""
    out = []
    for ref, w in zip(_REFS, _WINDOWS):
        expr = f"{record(w)}{sel(selector)} / {number(budget)}"
        out.append(query(service(expr) if per_service else expr, f"{who} {w}", ref))
    return out


def _windows_text() -> str:
    return ", ".join(_WINDOWS)


def _rows_text() -> str:
    return "; ".join(f"{row.long} and {row.short} above {row.factor:g}x: {row.severity}" for row in RULES.burn_windows)


def slo_row(g: Grid) -> None:
    """Burn rate per window of each SLO the rules alert on, and the error budget left of each."""
    g.row("SLO burn rate and error budget")
    common = (f"Burn rate = the window's error ratio / the error budget, one line per window ({_windows_text()}). "
              f"1 (orange line) spends the budget exactly in its period; an alert fires when a long window and its "
              f"short one both burn faster than their factor ({_rows_text()}); the red line is the lowest paging "
              f"factor. A short window high and the long ones low is a fresh incident (act now if it stays); the "
              f"long ones high with short ones falling is one that is ending.")
    for title, slo_def in (("Burn rate: TTFT", RULES.ttft), ("Burn rate: ITL", RULES.itl)):
        g.add(ts(
            title,
            f"The engine's {slo_def.title} SLO ({slo_def.objective:.3g} of observations within "
            f"{slo_def.threshold_seconds:g} s, the {slo_def.alert} rules), per service (cluster, namespace) and "
            f"model, summed over its replicas. {common} Which pod: the Latency and Head-of-line rows.",
            "none", _burn(lambda w, s=slo_def: slo.error_record(RULES, s, w), SERVICE, slo_def.budget, SERVICE_WHO,
                          per_service=True),
            thresholds=_BURN_LINES,
        ), 12, 8)
    g.add(ts(
        "Burn rate: engine availability",
        f"Requests the engine aborted or failed over all it finished (its finished-reason counters), against "
        f"the {1 - RULES.request_error_objective:.3g} budget of {availability.REQUEST_ALERT}, per service and "
        f"model. {common} An abort storm is clients giving up (TTFT past their timeout: see the TTFT burn) or "
        "the scheduler dropping requests; errors are the engine's own (its log).",
        "none", _burn(lambda w: availability.request_record(RULES, w), SERVICE, 1 - RULES.request_error_objective,
                      SERVICE_WHO, per_service=True),
        thresholds=_BURN_LINES,
    ), 12, 8)
    g.add(ts(
        "Burn rate: client availability (proxy)",
        f"Inference requests the proxy answered 5xx or saw cut by the upstream, over all it relayed, against the "
        f"{1 - RULES.client_error_objective:.3g} budget of {availability.CLIENT_ALERT}, per pod and target "
        f"(the proxy's view, which a crash-looping engine cannot reset). {common} See Client requests by finish "
        "reason for upstream_error; blank unless the proxy runs.",
        "none", _burn(availability.client_record, CLIENT, 1 - RULES.client_error_objective, "{{pod}} {{target}}",
                      per_service=False),
        thresholds=_BURN_LINES,
    ), 12, 8)
    g.add(ts(
        f"Error budget left ({_LONGEST} window)",
        f"1 - the error ratio over the longest burn window ({_LONGEST}) / the budget, per SLO: the share of that "
        "window's budget not yet spent, at its current pace. Below 0 the window has spent more than its budget: "
        "hold risky rollouts and work the SLO whose line is lowest. TTFT, ITL and engine availability per "
        "service and model; client availability per pod and target.",
        "percentunit", [
            query(service(f"1 - {slo.error_record(RULES, RULES.ttft, _LONGEST)}{sel(SERVICE)} / "
                          f"{number(RULES.ttft.budget)}"), f"{SERVICE_WHO} TTFT", "A"),
            query(service(f"1 - {slo.error_record(RULES, RULES.itl, _LONGEST)}{sel(SERVICE)} / "
                          f"{number(RULES.itl.budget)}"), f"{SERVICE_WHO} ITL", "B"),
            query(service(f"1 - {availability.request_record(RULES, _LONGEST)}{sel(SERVICE)} / "
                          f"{number(1 - RULES.request_error_objective)}"), f"{SERVICE_WHO} availability", "C"),
            query(f"1 - {availability.client_record(_LONGEST)}{sel(CLIENT)} / "
                  f"{number(1 - RULES.client_error_objective)}", "{{pod}} {{target}} client availability", "D"),
        ], min_val=None, max_val=1, thresholds=[(None, "transparent"), (0.0, "red")],
    ), 12, 8)


def active_alerts(g: Grid) -> None:
    """Every firing or pending Rooflight alert of the selection, full width."""
    g.add(ts(
        "Active Rooflight alerts",
        "Each firing or pending Rooflight alert as a line at 1, named with its pod. Empty is good. The alert "
        "names say which limit binds: HeadOfLineBlocking (prefill stalls decode), BatchCapacityCapped (the KV "
        "wall), LowDecodeMBU. Service-level alerts (SLO burn) have no pod and show whichever pod is selected.",
        "short", [query(f"ALERTS{{{ALERT}}}", "{{alertname}} {{alertstate}} {{pod}} {{target}}", "A")],
    ), 24, 6)
