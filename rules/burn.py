"""The SRE workbook's burn rows, built once for every SLO the rules page on (latency, availability, goodput).

A row fires when both its long and its short window burn faster than `factor x budget`, and only where:

- **the long window saw a sample**: `slo_min_requests` requests, and `slo_min_bad_events` bad ones (the
  ratio times the requests: slow first tokens, failed requests, or for ITL, requests' worth of slow tokens).
  ITL counts tokens, hundreds a request, so both count the requests of the TTFT histogram. Four slow
  requests in a quiet night hour are a ratio of 17%; they are not a burn rate anyone should be woken for;
- **the budget the row speaks of is spent** (every row but the fastest): a row's factor is the budget it
  would spend over its whole window (6x over 6 h is 5% of 30 days). A series younger than the window (a
  model launched an hour ago, a Prometheus that lost its data) has spent only its ratio times its age, so
  the row compares `ratio x age / window` with its limit: a new model burning 10x from launch pages on the
  6 h row once it has spent 5% of its budget (after 3.6 h), and half an hour of a slow burn on a fresh
  Prometheus spends a tenth of what the 6 h page means, and stays quiet. The age is how much of the window
  the SLO's series were present in, to a sixth of the row's short window (`count_over_time` of a subquery:
  hours a service was scaled to zero spent nothing). The fastest row judges from the first minutes, so an
  outage after a restart still pages.

Alerts of a per-model SLO also carry the model as `model` (a label template copying the engine's `model_name`),
the label Alertmanager groups and inhibits by (deploy/alertmanager/).
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
    counter: str  # the SLO's requests or observations, as a selector: how long its series have been present
    summary: Callable[[str], str]  # from the row's speed ("fast" pages, "steadily" tickets)
    description: Callable[[BurnWindow], str]
    dashboard: Link
    requests: Callable[[str], str] | None = None  # requests over a window, by `by` (default: the counter's)
    model_label: str = ""  # the SLO's label naming the model, copied to `model` on its alerts


def speed(row: BurnWindow) -> str:
    return "fast" if row.severity == "critical" else "steadily"


def increase_by(by: str, counter: str) -> Callable[[str], str]:
    """`counter`'s increase over a window, summed by `by`."""
    return lambda window: f"sum by ({by}) (increase({counter}[{window}]))"


AGE_STEPS = 6  # the age's resolution: a sixth of the row's short window (5m for the 6h row)


def age_fraction(slo: BurnSLO, row: BurnWindow) -> str:
    """How much of the row's long window the SLO's series were present in, 0..1, to a sixth of its short
    window (a subquery of 72 steps for the workbook's rows, counting those that found them: hours a service
    was scaled to zero are no part of what it spent)."""
    step = seconds(row.short) / AGE_STEPS
    present = f"count_over_time((group by ({slo.by}) ({slo.counter}))[{row.long}:{duration(step)}])"
    return f"clamp_max({present} * {number(step / seconds(row.long))}, 1)"


def slo_windows(config: RulesConfig) -> list[str]:
    """Every window any burn row needs, shortest first: each SLO records its error ratio over these."""
    windows = {w for row in config.burn_windows for w in (row.long, row.short)}
    return sorted(windows, key=seconds)


def fastest(config: RulesConfig) -> float:
    return min(seconds(row.long) for row in config.burn_windows)


def burn_expr(config: RulesConfig, slo: BurnSLO, row: BurnWindow) -> str:
    limit = number(row.factor * slo.budget)
    requests = slo.requests or increase_by(slo.by, slo.counter)
    long = slo.record(row.long)
    expr = (
        f"{long} > {limit}\nand\n{slo.record(row.short)} > {limit}\n"
        f"and on ({slo.by})\n{requests(row.long)} >= {config.slo_min_requests}\n"
        f"and on ({slo.by})\n({long} * on ({slo.by}) {requests(row.long)}) >= {config.slo_min_bad_events}"
    )
    if seconds(row.long) > fastest(config):
        expr += f"\nand on ({slo.by})\n({long} * on ({slo.by}) {age_fraction(slo, row)}) > {limit}"
    return expr


def burn_alerts(config: RulesConfig, slo: BurnSLO) -> list[Rule]:
    """One alert per row of RulesConfig.burn_windows, labelled with its windows."""
    # the model as `model`, a label template (the expression's own labels stay the series', which the
    # description's queries match with)
    model = {"model": f"{{{{ $labels.{slo.model_label} }}}}"} if slo.model_label and slo.model_label != "model" else {}
    return [
        alert(config, slo.alert, burn_expr(config, slo, row), row.for_, row.severity, slo.summary(speed(row)),
              slo.description(row), {"long": row.long, "short": row.short, **model}, dashboard=slo.dashboard)
        for row in config.burn_windows
    ]
