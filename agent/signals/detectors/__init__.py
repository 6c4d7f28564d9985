"""Composite detectors evaluated at the agent's sampling resolution: what binds the batch, and why ITL stutters.

Each detector is one module of this package that declares itself (`DETECTOR = Detector(...)`, base.py): its
pure function, its knobs, its series, alert, runbook, panel and NVTX mark. This module finds them (every
module but base, in their `order`), and `evaluate` runs each on one set of windowed inputs into Verdicts.
Everything that shows a detector reads `detectors()`: /metrics and the catalogue, the status page and the
APIs, the rules, the dashboards, the NVTX marks and the runbook check (docs/detectors.md). The definitions
are in docs/physics.md (sections Head-of-line blocking and Batch verdicts); what to do about each is in
docs/runbooks.md. Pure: no I/O, no clock; the sampler computes the inputs from its windows.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Iterator, Mapping

from rooflight.agent.errors import ConfigError
from rooflight.agent.signals.detectors.base import (
    CHECKS, ITL_FROM_ENGINE, ITL_FROM_PROXY, ITL_SOURCES, Detector, DetectorInputs, Knob, runbook_anchor,
)

__all__ = ["ITL_FROM_ENGINE", "ITL_FROM_PROXY", "ITL_SOURCES", "Detector", "DetectorInputs", "DetectorThresholds",
           "Verdicts", "detectors", "evaluate", "knobs", "runbook_anchor"]


def _discover() -> tuple[Detector, ...]:
    """The DETECTOR of every module of this package but base, by its order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        detector = getattr(module, "DETECTOR", None)
        if not isinstance(detector, Detector):
            raise TypeError(f"{module.__name__} declares no DETECTOR = Detector(...) (docs/detectors.md)")
        found.append(detector)
    keys = [d.key for d in found]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two detectors share a key: {sorted(keys)}")
    return tuple(sorted(found, key=lambda d: (d.order, d.key)))


DETECTORS: tuple[Detector, ...] = _discover()


def detectors() -> tuple[Detector, ...]:
    """Every detector, in the page's, the catalogue's and /metrics' order (read at call time: a test may add one)."""
    return DETECTORS


def knobs() -> tuple[Knob, ...]:
    """Every detector's knobs, each once, in the detectors' order."""
    return tuple({k.name: k for d in detectors() for k in d.knobs}.values())


class _Fields:
    """Named values read as attributes, frozen: what the knobs are set to, what the detectors concluded."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_fields", dict(fields))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields == other._fields  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


class DetectorThresholds(_Fields):
    """The knobs of every detector (each declared with its detector, with the reason for its default), as
    numbers: `DetectorThresholds(hol_inflation=4)`, the rest their defaults. A value out of its knob's range
    is a ConfigError saying which (exit 2 at start); a name no detector declares, a TypeError."""

    __slots__ = ()

    def __init__(self, **given: float) -> None:
        declared = knobs()
        unknown = set(given) - {k.name for k in declared}
        if unknown:
            raise TypeError(f"no detector knob {', '.join(sorted(unknown))}")
        values = {k.name: float(given.get(k.name, k.default)) for k in declared}
        for check in CHECKS:  # the kinds in turn: with two bad knobs, the one named is the one it always was
            for k in declared:
                problem = k.problem(values[k.name]) if k.check == check else None
                if problem:
                    raise ConfigError(problem)
        super().__init__(values)


class Verdicts(_Fields, Mapping[str, Any]):
    """What the detectors concluded, by field: each detector's key (True, False, None = cannot tell), and the
    numbers and choices its verdict carries. Read as attributes (`verdicts.head_of_line`) or as a mapping."""

    __slots__ = ()

    def __init__(self, fields: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        super().__init__({**(fields or {}), **more})

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    __eq__ = _Fields.__eq__
    __hash__ = _Fields.__hash__

    def replace(self, **changes: Any) -> Verdicts:
        return Verdicts(self._fields, **changes)


def evaluate(inputs: DetectorInputs, thresholds: DetectorThresholds) -> Verdicts:
    """Every detector on one set of windowed inputs: each one's verdict, then the numbers and choice it carries."""
    fields: dict[str, Any] = {}
    for d in detectors():
        fields[d.key] = d.judge(inputs, thresholds)
        for v in d.values:
            fields[v.attr] = v.read(inputs)
        if d.choice is not None:
            fields[d.choice.attr] = d.choice.read(inputs)
    return Verdicts(fields)
