"""Renders the current ClientSnapshot as Prometheus families: formatting only, no arithmetic.

The snapshot is built off the scrape path (the proxy refreshes it every second); `collect()` turns its
tuples into families in catalog order. A value that is negative or not finite is not exported. The
family and collector machinery is the agent's own (agent/metrics/families.py).
"""

from __future__ import annotations

from typing import Callable

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from rooflight.agent.metrics.families import Families, SnapshotCollector, nonneg, registry_of
from rooflight.agent.proxy.catalog import BY_NAME, CATALOG
from rooflight.agent.proxy.stats import ClientSnapshot


def render(snap: ClientSnapshot) -> list[Metric]:
    f = Families(BY_NAME)
    for name, labels, value in (*snap.counters, *snap.gauges):
        f.add(name, labels, nonneg(value))
    for h in snap.histograms:
        f.add_histogram(h.name, h.labels, h.bounds, h.cumulative, h.sum)
    return f.in_order(CATALOG)


class ClientCollector(SnapshotCollector[ClientSnapshot]):
    """A prometheus-client Collector over whatever ClientSnapshot `current()` returns."""

    def __init__(self, current: Callable[[], ClientSnapshot]) -> None:
        super().__init__(current, render)


def registry_for(current: Callable[[], ClientSnapshot]) -> CollectorRegistry:
    return registry_of(ClientCollector(current))
