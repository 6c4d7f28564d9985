"""Renders the current ClientSnapshot as Prometheus families: formatting only, no arithmetic.

The snapshot is built off the scrape path (the proxy refreshes it every second); `collect()` turns its
tuples into families in catalog order. A value that is negative or not finite is not exported.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from rooflight.agent.proxy.catalog import BY_NAME, CATALOG
from rooflight.agent.proxy.stats import ClientSnapshot


def _family(name: str) -> Metric:
    d = BY_NAME[name]
    base = name[: -len("_total")] if d.type == "counter" else name
    if d.type == "counter":
        return CounterMetricFamily(base, d.help, labels=d.labels)
    if d.type == "histogram":
        return HistogramMetricFamily(name, d.help, labels=d.labels)
    return GaugeMetricFamily(name, d.help, labels=d.labels)


def render(snap: ClientSnapshot) -> list[Metric]:
    families: dict[str, Metric] = {}

    def family(name: str) -> Metric:
        f = families.get(name)
        if f is None:
            f = families[name] = _family(name)
        return f

    for name, labels, value in (*snap.counters, *snap.gauges):
        if math.isfinite(value) and value >= 0:
            family(name).add_metric(list(labels), value)
    for h in snap.histograms:
        buckets = [(floatToGoString(b), float(n)) for b, n in zip(h.bounds, h.cumulative)]
        buckets.append(("+Inf", float(h.cumulative[-1])))
        family(h.name).add_metric(list(h.labels), buckets, h.sum)  # type: ignore[call-arg]
    return [families[d.name] for d in CATALOG if d.name in families]


class ClientCollector(Collector):
    """A prometheus-client Collector over whatever ClientSnapshot `current()` returns."""

    def __init__(self, current: Callable[[], ClientSnapshot]) -> None:
        self._current = current

    def collect(self) -> Iterator[Metric]:
        return iter(render(self._current()))

    def describe(self) -> list[Metric]:
        return []


def registry_for(current: Callable[[], ClientSnapshot]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientCollector(current))
    return registry
