"""The SRE workbook's burn rows, built once for every SLO the rules page on (latency, availability, goodput).

A row fires when both its long and its short window burn faster than `factor x budget`, and only where:

- **the long window saw a sample** (`slo_min_requests` of the SLO's requests or observations): two slow
  requests in a quiet hour are not a burn rate;
- **the long window holds history from its start** (every row but the fastest): a row's factor is the budget
  it would spend over its whole window (6x over 6 h is 5% of 30 days). A Prometheus that lost its data (a new
  pod on an emptyDir, a wiped volume) or a service deployed minutes ago has only minutes in that window,
  which then reads what the short window reads, and every row goes pending together: the 6 h page and the 1 d
  and 3 d tickets fire on half an hour of errors that spent a tenth of the budget they speak of. Each slower
  row waits until its series were present at the far end of its window (the oldest `short` of it); the
  fastest row judges from the first minutes, so an outage after a restart still pages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rooflight.rules.alerts import Link, alert
from rooflight.rules.config import BurnWindow, RulesConfig
from rooflight.rules.promql import number
from rooflight.rules.recording import Rule

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def seconds(window: str) -> float:
    """A one-unit Prometheus duration ('30m', '6h') in seconds."""
    unit = window.lstrip("0123456789")
    return float(window[: len(window) - len(unit)]) * _UNIT_SECONDS[unit]


def duration(total: float) -> str:
    """Seconds as a Prometheus duration with the largest whole units: 19800 -> '5h30m'."""
    left, out = int(total), ""
    for unit in ("d", "h", "m", "s"):
        size = int(_UNIT_SECONDS[unit])
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0s"


@dataclass(frozen=True)
class BurnSLO:
    """What differs between the SLOs' burn rows; the rows, their guards and their labels are built here once."""

    alert: str
    budget: float  # 1 - objective
    record: Callable[[str], str]  # the recorded error ratio over a window
    by: str  # the labels the guards join on (the record's)
    counter: str  # the SLO's requests or observations: the sample and history guards read it
    summary: Callable[[str], str]  # from the row's speed ("fast" pages, "steadily" tickets)
    description: Callable[[BurnWindow], str]
    dashboard: Link


def speed(row: BurnWindow) -> str:
    return "fast" if row.severity == "critical" else "steadily"


def has_history(by: str, counter: str, row: BurnWindow) -> str:
    """Where the SLO's series were scraped at the far end of the row's long window (its oldest `short`)."""
    far = duration(seconds(row.long) - seconds(row.short))
    return f"group by ({by}) (present_over_time({counter}[{row.short}] offset {far}))"


def slo_windows(config: RulesConfig) -> list[str]:
    """Every window any burn row needs, shortest first: each SLO records its error ratio over these."""
    windows = {w for row in config.burn_windows for w in (row.long, row.short)}
    return sorted(windows, key=seconds)


def fastest(config: RulesConfig) -> float:
    return min(seconds(row.long) for row in config.burn_windows)


def burn_expr(config: RulesConfig, slo: BurnSLO, row: BurnWindow) -> str:
    limit = number(row.factor * slo.budget)
    expr = (
        f"{slo.record(row.long)} > {limit}\nand\n{slo.record(row.short)} > {limit}\n"
        f"and on ({slo.by})\nsum by ({slo.by}) (increase({slo.counter}[{row.long}])) >= {config.slo_min_requests}"
    )
    if seconds(row.long) > fastest(config):
        expr += f"\nand on ({slo.by})\n{has_history(slo.by, slo.counter, row)}"
    return expr


def burn_alerts(config: RulesConfig, slo: BurnSLO) -> list[Rule]:
    """One alert per row of RulesConfig.burn_windows, labelled with its windows."""
    return [
        alert(config, slo.alert, burn_expr(config, slo, row), row.for_, row.severity, slo.summary(speed(row)),
              slo.description(row), {"long": row.long, "short": row.short}, dashboard=slo.dashboard)
        for row in config.burn_windows
    ]
