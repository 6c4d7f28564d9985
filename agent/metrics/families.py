"""Metric families built at scrape time from a catalog, and a Collector over a frozen snapshot.

The one copy of this machinery, shared by the agent's /metrics (agent/metrics/exposition.py) and the
client-side proxy's (agent/proxy/exposition.py): each renders its own snapshot into a `Families`, which
creates a family the first time one of its series is added (with the catalog's type, help and labels)
and leaves out any value that is missing or not finite. Absent means "cannot be derived here", never a
made-up zero, and a family with no series is not exported at all.
"""

from __future__ import annotations

import math
from typing import Callable, Generic, Iterable, Iterator, Mapping, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from rooflight.agent.metrics.family import MetricDef

S = TypeVar("S")


def nonneg(value: float | None) -> float | None:
    """The value where it is zero or more, else None (a negative count or ratio is not a reading)."""
    return value if value is not None and value >= 0 else None


def new_family(d: MetricDef) -> Metric:
    """An empty family of `d`'s type (a counter's exposed name drops `_total`: prometheus-client adds it)."""
    if d.type == "counter":
        return CounterMetricFamily(d.name, d.help, labels=d.labels)
    if d.type == "histogram":
        return HistogramMetricFamily(d.name, d.help, labels=d.labels)
    return GaugeMetricFamily(d.name, d.help, labels=d.labels)


class Families:
    """Lazily created metric families, in the order their first series arrived, from `defs` by name."""

    def __init__(self, defs: Mapping[str, MetricDef]) -> None:
        self._families: dict[str, Metric] = {}
        self._defs = defs

    def _family(self, name: str) -> Metric:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = new_family(self._defs[name])
        return family

    def add(self, name: str, labels: Iterable[str], value: float | None) -> None:
        """One sample; nothing where `value` is None or not finite."""
        if value is None or not math.isfinite(value):
            return
        self._family(name).add_metric(list(labels), value)

    def add_info(self, name: str, labels: Mapping[str, str]) -> None:
        """An info sample (value 1) whose label set varies from sample to sample: the catalog's labels
        plus whatever `labels` holds beyond them (the engine's settings)."""
        self._family(name).samples.append(Sample(name, dict(labels), 1.0))

    def add_histogram(self, name: str, labels: Iterable[str], bounds: Iterable[float], cumulative: Iterable[int],
                      total: float) -> None:
        """One histogram series: cumulative counts per upper bound, then the +Inf one (= the count)."""
        counts = list(cumulative)
        buckets = [(floatToGoString(b), float(n)) for b, n in zip(bounds, counts)]
        buckets.append(("+Inf", float(counts[-1])))
        self._family(name).add_metric(list(labels), buckets, total)  # type: ignore[call-arg]

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())

    def in_order(self, defs: Iterable[MetricDef]) -> list[Metric]:
        """The families in the order of `defs` (a catalog), whatever order their series arrived in."""
        return [self._families[d.name] for d in defs if d.name in self._families]


class SnapshotCollector(Collector, Generic[S]):
    """A prometheus-client Collector over whatever snapshot `current()` returns, rendered by `render`."""

    def __init__(self, current: Callable[[], S], render: Callable[[S], list[Metric]]) -> None:
        self._current = current
        self._render = render

    def collect(self) -> Iterator[Metric]:
        return iter(self._render(self._current()))

    def describe(self) -> list[Metric]:
        return []  # families depend on the snapshot; nothing to pre-register


def registry_of(collector: Collector) -> CollectorRegistry:
    """A registry holding only `collector` (no process or platform collectors: /metrics shows only ours)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
