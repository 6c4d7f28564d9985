"""The catalogue: every family the agent exports, in the order /metrics shows them, and docs/metrics.md's table.

The families are those agent/metrics/names.py declares, with each detector's series in their place (after the
capacity signals, as the exposition walks a series), as each detector declares them (agent/signals/detectors/). The exposition
renders from this list, docs/metrics.md's table is generated from it (`python -m rooflight.regen`), and the
rules and dashboards are checked to name only what it (or a supported engine) exports.
"""

from __future__ import annotations

import functools
from typing import Iterable

from rooflight.agent.metrics import names
from rooflight.agent.metrics.family import SCOPES, SERIES_LABELS, VERDICTS, Family, MetricDef
from rooflight.agent.signals import detectors as signal_detectors
from rooflight.agent.signals.detectors.base import Choice

__all__ = ["BY_NAME", "MetricDef", "all_defs", "counter", "families", "gauge", "markdown_table", "table_of"]


def gauge(name: str, labels: tuple[str, ...], unit: str, help_: str) -> MetricDef:
    return MetricDef(name, "gauge", labels, unit, help_)


def counter(name: str, labels: tuple[str, ...], unit: str, help_: str) -> MetricDef:
    return MetricDef(name, "counter", labels, unit, help_)


_KEPT: list[tuple[object, object, tuple[Family, ...]]] = []  # (declared, detectors, families) as last put together


def families() -> tuple[Family, ...]:
    """Every family, by scope in the exposition's order, the declarations and the detectors as they
    stand now (put together again only when either changed: every scrape asks)."""
    declared, detectors = names.FAMILIES, signal_detectors.detectors()
    if not _KEPT or _KEPT[0][0] is not declared or _KEPT[0][1] is not detectors:
        every = (*declared, *detector_families(detectors))
        _KEPT[:] = [(declared, detectors, tuple(sorted(every, key=lambda f: SCOPES.index(f.scope))))]
    return _KEPT[0][2]


def detector_families(detectors: Iterable[signal_detectors.Detector]) -> tuple[Family, ...]:
    """Each detector's series from its verdicts: every flag (1, 0, or absent while it cannot tell), then the
    numbers verdicts carry, then the choices they name (one series per choice, 1 for the one named)."""
    detectors = tuple(detectors)
    flags = tuple(Family(d.flag.metric, "gauge", (*SERIES_LABELS, *d.flag.labels), d.flag.unit, d.flag.help,
                         scope=VERDICTS, value=functools.partial(_verdict, d.key), nonneg=False)
                  for d in detectors)
    values = tuple(Family(v.series.metric, "gauge", (*SERIES_LABELS, *v.series.labels), v.series.unit,
                          v.series.help, scope=VERDICTS, value=functools.partial(_verdict, v.attr), page=v.attr)
                   for d in detectors for v in d.values)
    choices = tuple(Family(c.series.metric, "gauge", (*SERIES_LABELS, *c.series.labels), c.series.unit,
                           c.series.help, scope=VERDICTS, value=functools.partial(_choice, c))
                    for d in detectors if (c := d.choice) is not None)
    return flags + values + choices


def _verdict(attr: str, verdicts: object) -> object:
    return getattr(verdicts, attr, None)


def _choice(choice: Choice, verdicts: object) -> dict[str, float]:
    chosen = getattr(verdicts, choice.attr, None) or choice.default
    return {c: float(c == chosen) for c in choice.choices}


def all_defs() -> tuple[Family, ...]:
    """Every metric the agent exports, in docs/metrics.md's order (the exposition's)."""
    return families()


BY_NAME = {f.name: f for f in families()}


def table_of(defs: Iterable[MetricDef]) -> str:
    """A reference table of docs/metrics.md: one row per metric."""
    rows = ["| name | type | labels | unit | meaning |", "|---|---|---|---|---|"]
    for d in defs:
        labels = ", ".join(f"`{label}`" for label in d.labels)
        rows.append(f"| `{d.name}` | {d.type} | {labels} | {d.unit or '-'} | {d.help} |")
    return "\n".join(rows) + "\n"


def markdown_table() -> str:
    """The reference table in docs/metrics.md (generated: `python -m rooflight.regen`)."""
    return table_of(all_defs())


if __name__ == "__main__":
    print(markdown_table(), end="")
