"""Panels more than one dashboard shows, written once: the SLO burn row and the list of active alerts.

The SLO row reads the recording rules of rules/ (their names come from the rule modules' own builders, and
the objectives and burn windows from RulesConfig), so a panel shows exactly the ratio an alert judges:
burn rate = error ratio / (1 - objective), the factor RulesConfig.burn_windows compares with. The engine's
SLOs (TTFT, ITL, availability) are the service's: summed over replicas, one series per service and model
(`service()`); the proxy's availability is per replica and target, as its rules are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rooflight.rules import availability, slo
from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import number

from .panels import ALERT, SERVICE, SERVICE_WHO, Grid, query, sel, service, ts

RULES = RulesConfig()
_WINDOWS = slo.slo_windows(RULES)  # every window a burn row reads, shortest first
_LONGEST = _WINDOWS[-1]
_REFS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Lines on the burn panels: 1 spends the budget exactly over its period; the lowest paging factor pages.
_PAGE = min(row.factor for row in RULES.burn_windows if row.severity == "critical")
_BURN_LINES = [(None, "transparent"), (1.0, "orange"), (_PAGE, "red")]


@dataclass(frozen=True)
class _Slo:
    """One SLO the rules alert on, as its burn panel and its line in the budget panel show it."""

    title: str  # the burn panel's
    short: str  # its line's legend in the budget panel, after `who`
    record: Callable[[str], str]  # the recording rule of its error ratio over a window
    selector: str
    budget: float
    who: str
    per_service: bool  # a service-level record (summed over replicas), kept to the selected agents' services
    before: str  # the burn panel's description, before and after the text every burn panel shares
    after: str

    def ratio(self, window: str, minus_from: str = "") -> str:
        """The window's error ratio over the budget (`minus_from` 1: the budget left)."""
        expr = f"{minus_from}{self.record(window)}{sel(self.selector)} / {number(self.budget)}"
        return service(expr) if self.per_service else expr


def _slos() -> tuple[_Slo, ...]:
    latency = tuple(
        _Slo(f"Burn rate: {short}", short, lambda w, s=slo_def: slo.error_record(RULES, s, w), SERVICE, slo_def.budget,
             SERVICE_WHO, True,
             f"The engine's {slo_def.title} SLO ({slo_def.objective:.3g} of observations within "
             f"{slo_def.threshold_seconds:g} s, the {slo_def.alert} rules), per service (cluster, namespace) and "
             "model, summed over its replicas.", "Which pod: the Latency and Head-of-line rows.")
        for short, slo_def in (("TTFT", RULES.ttft), ("ITL", RULES.itl))
    )
    return (
        *latency,
        _Slo("Burn rate: engine availability", "availability", lambda w: availability.request_record(RULES, w),
             SERVICE, 1 - RULES.request_error_objective, SERVICE_WHO, True,
             f"Requests the engine aborted or failed over all it finished (its finished-reason counters), against "
             f"the {1 - RULES.request_error_objective:.3g} budget of {availability.REQUEST_ALERT}, per service and "
             "model.", "An abort storm is clients giving up (TTFT past their timeout: see the TTFT burn) or the "
             "scheduler dropping requests; errors are the engine's own (its log)."),
        _Slo("Burn rate: client availability", "client availability", lambda w: availability.client_record(RULES, w),
             SERVICE, 1 - RULES.client_error_objective, SERVICE_WHO, True,
             f"Inference requests answered 5xx or cut by the upstream, over all of them, against the "
             f"{1 - RULES.client_error_objective:.3g} budget of {availability.CLIENT_ALERT}, per service and model, "
             "summed over its pods: the proxy's count where it runs (which a crash-looping engine cannot reset), "
             "else the engine API server's own HTTP responses.", "See Client requests by finish reason for "
             "upstream_error through the proxy."),
    )


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
    slos = _slos()
    for s in slos:
        g.add(ts(
            s.title, f"{s.before} {common} {s.after}", "none",
            [query(s.ratio(w), f"{s.who} {w}", ref) for ref, w in zip(_REFS, _WINDOWS)],
            thresholds=_BURN_LINES,
        ), 12, 8)
    g.add(ts(
        f"Error budget left ({_LONGEST} window)",
        f"1 - the error ratio over the longest burn window ({_LONGEST}) / the budget, per SLO: the share of that "
        "window's budget not yet spent, at its current pace. Below 0 the window has spent more than its budget: "
        "hold risky rollouts and work the SLO whose line is lowest. Each per service and model.",
        "percentunit", [query(s.ratio(_LONGEST, minus_from="1 - "), f"{s.who} {s.short}", ref)
                        for ref, s in zip(_REFS, slos)],
        min_val=None, max_val=1, thresholds=[(None, "transparent"), (0.0, "red")],
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
