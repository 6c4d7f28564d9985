"""Small string builders for PromQL: selectors, label lists, `le` matchers, recording-rule names.

Kept apart so every rule module splices user selectors the same way and an empty selector never
leaves a stray `{}` or `, ` behind.
"""

from __future__ import annotations

import re

_SUFFIX = re.compile(r"^[0-9]+[a-z]+$")


def matchers(*parts: str) -> str:
    """Join non-empty matcher lists: matchers('job="a"', '', 'le="1"') -> 'job="a", le="1"'."""
    return ", ".join(p.strip() for p in parts if p and p.strip())


def series(metric: str, *parts: str) -> str:
    """A vector selector with the given matchers, or the bare name when there are none."""
    inner = matchers(*parts)
    return f"{metric}{{{inner}}}" if inner else metric


def labels(names: tuple[str, ...]) -> str:
    """'target, model' for by()/on() clauses."""
    return ", ".join(names)


def level(names: tuple[str, ...]) -> str:
    """The `level` part of a level:metric:operations name: the aggregation labels joined by `_`."""
    return "_".join(names)


def record_name(level_labels: tuple[str, ...], metric: str, operations: str) -> str:
    return f"{level(level_labels)}:{metric}:{operations}"


def window_suffix(window: str) -> str:
    """'5m' -> 'rate5m'-style suffix part; only simple durations make readable names."""
    if not _SUFFIX.match(window):
        raise ValueError(f"window {window!r} must be one number and one unit for rule names")
    return window


def le_matcher(threshold: float) -> str:
    """Match a histogram bucket edge however the exporter spelled it.

    Python clients write `le="1.0"`, Go clients `le="1"`, and Prometheus 3 normalises to floats, so
    whole-number edges use a regex that accepts both; other edges are written as Python prints them.
    """
    if float(threshold).is_integer():
        return f'le=~"{int(threshold)}(\\\\.0)?"'
    return f'le="{float(threshold)!r}"'


def number(value: float) -> str:
    """A threshold as PromQL reads it, without float noise: 14.4 * 0.01 -> 0.144."""
    return f"{value:.10g}"
