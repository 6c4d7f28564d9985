"""The rules with every duration divided by one factor: `rooflight rules --time-scale 20`.

An incident that takes an hour to page takes three minutes at 20x: the end-to-end stage runs the shipped
rules so, on a real Prometheus, against agents that live for minutes (tests/e2e/test_notifications_e2e.py).
Every window, `for`, `keep_firing_for`, burn row and memory of the config is divided; the agent's own
windows that the rules read as label values (`window="5m"`) are not durations of the rules and stay. Only
durations, never thresholds, shares or the structure of a rule, change, so what pages at 20x is what pages
at 1x, sooner.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.rules.burn import seconds
from rooflight.rules.config import RulesConfig, check_duration

# The agent's --windows entries the rules select by label: the agent's, not the rules' time.
AGENT_WINDOWS = frozenset({"itl_short_window", "itl_long_window", "saturation_window", "capacity_window"})
_PART = re.compile(r"[0-9]+(?:ms|s|m|h|d|w|y)")


def _scaled_duration(value: str, factor: int, what: str) -> str:
    total = sum(seconds(part) for part in _PART.findall(value))
    if total % factor:
        raise ConfigError(f"--time-scale {factor}: {what} {value} is not a whole number of seconds divided by it")
    return _one_unit(int(total) // factor)


def _one_unit(total: int) -> str:
    """Seconds in the largest one unit that holds them whole (90 -> 90s, 4320 -> 72m): a rule name's window
    is one number and one unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if total and total % size == 0:
            return f"{total // size}{unit}"
    return f"{total}s"


def _scale(value: Any, factor: int, what: str) -> Any:
    if isinstance(value, str) and value and _is_duration(value):
        return _scaled_duration(value, factor, what)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _scale_fields(value, factor, f"{what}.", frozenset())
    if isinstance(value, tuple) and _holds_dataclass(value):  # e.g. the detector alerts: ((key, DetectorAlert), ...)
        return tuple(_scale(v, factor, f"{what}[{i}]") for i, v in enumerate(value))
    return value


def _holds_dataclass(value: tuple[Any, ...]) -> bool:
    return any((dataclasses.is_dataclass(v) and not isinstance(v, type))
               or (isinstance(v, tuple) and _holds_dataclass(v)) for v in value)


def _is_duration(value: str) -> bool:
    try:
        check_duration(value, "")
    except ConfigError:
        return False
    return True


def _scale_fields(obj: Any, factor: int, what: str, keep: frozenset[str]) -> Any:
    changes = {f.name: _scale(getattr(obj, f.name), factor, f"{what}{f.name}")
               for f in dataclasses.fields(obj) if f.name not in keep}
    return dataclasses.replace(obj, **changes)


def scaled(config: RulesConfig, factor: int) -> RulesConfig:
    """`config` with every rule duration divided by `factor` (1: unchanged); ConfigError where one is not a
    whole number of seconds once divided."""
    if factor < 1:
        raise ConfigError(f"--time-scale must be a whole number of at least 1 (got {factor})")
    if factor == 1:
        return config
    return _scale_fields(config, factor, "", AGENT_WINDOWS)
