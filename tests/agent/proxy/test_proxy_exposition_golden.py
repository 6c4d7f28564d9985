"""The proxy's /metrics, byte for byte, for a snapshot that holds every family it exports.

A capture of what the proxy's collector rendered before it shared the agent's family machinery
(agent/metrics/families.py): the golden was written by the old code, so any change to the text the
proxy serves (family order, counter names, histogram buckets, the values it leaves out) shows here.
Both formats Prometheus can ask for are held: the text format and OpenMetrics.
"""

from __future__ import annotations

import math

from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from rooflight.agent.proxy import catalog as c
from rooflight.agent.proxy.exposition import registry_for
from rooflight.agent.proxy.stats import ClientSnapshot, HistogramValue
from support import GOLDEN, check_golden, promtool_clean


def _snapshot() -> ClientSnapshot:
    """Every catalog family with one or more series, values out of order of the catalog, plus values the
    exposition must leave out (negative, NaN, infinite)."""
    counters = (
        (c.BAD_REQUESTS, ("t", "malformed"), 2.0),
        (c.REQUESTS, ("t", "chat", "true", "200", "stop", "none"), 7.0),
        (c.REQUESTS, ("t", "other", "false", "none", "none", "none"), 1.0),
        (c.PROMPT_TOKENS, ("t", "none", "usage"), 1200.0),
        (c.OUTPUT_TOKENS, ("t", "none", "chunks"), 340.0),
        (c.SLO_REQUESTS, ("t", "interactive", "none"), 7.0),
        (c.SLO_GOOD, ("t", "interactive", "none"), 6.0),
        (c.UPSTREAM_ERRORS, ("t", "connect"), 1.0),
        (c.UPSTREAM_ERRORS, ("t", "timeout"), -1.0),  # left out
        (c.ACCOUNTING_ERRORS, ("t",), 0.0),
        (c.OVER_BUDGET, ("t",), float("nan")),  # left out: the family never appears
        (c.REFUSED, ("t", "per_client"), 3.0),
    )
    gauges = (
        (c.IN_FLIGHT, ("t",), 2.0),
        (c.TTFT, ("t", "1m", "99"), 0.25),
        (c.TTFT, ("t", "1m", "50"), 0.125),
        (c.ITL, ("t", "1m", "99"), 0.0125),
        (c.TPOT, ("t", "1m", "99"), math.inf),  # left out
        (c.E2E, ("t", "1m", "99"), 3.5),
        (c.GOODPUT_RATIO, ("t", "interactive", "1m"), 6 / 7),
        (c.GOODPUT_RATE, ("t", "interactive", "1m"), 0.1),
        (c.SLO_TARGET, ("t", "interactive", "ttft"), 0.5),
    )
    histograms = (
        HistogramValue(c.ITL_HISTOGRAM, ("t", "chat"), (0.01, 0.025, 0.1), (3, 9, 10, 11), 0.4),
        HistogramValue(c.TTFT_HISTOGRAM, ("t", "chat"), (0.1, 0.5), (1, 6, 7), 1.75),
        HistogramValue(c.TTFT_HISTOGRAM, ("t", "completions"), (0.1, 0.5), (0, 0, 1), 2.0),
        HistogramValue(c.E2E_HISTOGRAM, ("t", "chat"), (1.0, 5.0), (2, 7, 7), 11.0),
    )
    return ClientSnapshot(created=1.0, counters=counters, gauges=gauges, histograms=histograms)


def test_proxy_exposition_is_unchanged() -> None:
    registry = registry_for(_snapshot)
    text = generate_latest(registry).decode()
    promtool_clean(text)
    check_golden(GOLDEN / "proxy" / "client-families.prom", text)
    check_golden(GOLDEN / "proxy" / "client-families.openmetrics", generate_openmetrics(registry).decode())
