"""Two replicas that share a target label, on a real Prometheus: each one's recorded MBU is its own.

In a Kubernetes Deployment every replica's sidecar watches its own engine at 127.0.0.1:8000, so every
agent exports target="127.0.0.1:8000" and the same model; only the labels Prometheus attaches to the
scrape (here `instance`) tell them apart. This test runs two `rooflight demo` processes (each a
simulated vLLM plus the real agent, different seeds), and one Prometheus (tests/promstack.py, scrape and
evaluation every 1 s) that scrapes both agents and evaluates the rules rendered from the production
RulesConfig with a 1m rate window, so the recording rules can be compared with the agents' own 1m MBU.

`rooflight demo` names its target after its engine's address (127.0.0.1:<port>), and two engines on one
machine cannot share a port, so the scrape's metric relabelling rewrites `target` to 127.0.0.1:8000 on
both: what Prometheus stores is exactly what it stores for two sidecars. Then, through the HTTP API:

- the per-rank MBU recording rule has one series per instance, each with target="127.0.0.1:8000";
- each instance's recorded MBU agrees with that agent's own 1m rooflight_mbu_ratio (both averaged over
  SMOOTH, within TOLERANCE, as in test_alerts_e2e.py), and is about half the two agents' sum, which is
  what rules aggregating by (target, engine, model, rank) recorded for both;
- the fleet rule (by model, on purpose) is sum(bytes/s) / sum(peak bytes/s): with equal peaks, the mean.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import pytest

from rooflight.rules.config import RulesConfig
from rooflight.rules.promql import record_name
from rooflight.rules.recording import rank_labels
from rooflight.rules.render import render
import promstack
from demo_procs import start_demo, stop_process

SHARED_TARGET = "127.0.0.1:8000"
CONFIG = replace(RulesConfig(), rate_window="1m")  # the agent's 1m window, so the two compare directly
MBU_RULE = record_name(rank_labels(CONFIG), "rooflight_mbu", "ratio_rate1m")
FLEET_RULE = "model:rooflight_mbu:ratio_rate1m"
TOLERANCE = 0.05  # see test_alerts_e2e.py (measured here -0.7% to +0.1%; the old rules read +6.0% and +6.2%)
SMOOTH = "20s"
MIN_SCRAPED_SECONDS = 85.0  # a full 1m window on both sides, then SMOOTH and a margin
SEEDS = (1, 2)

needs_prometheus = pytest.mark.skipif(not promstack.available(), reason="Debian's prometheus is not installed")


class SharedTargetStack(promstack.PromStack):
    """A PromStack whose scrape rewrites every agent's `target` to the one all sidecars share."""

    def config(self, rule_names: Sequence[str]) -> dict[str, Any]:
        doc = super().config(rule_names)
        doc["scrape_configs"][0]["metric_relabel_configs"] = [
            {"source_labels": ["target"], "regex": r"127\.0\.0\.1:[0-9]+", "target_label": "target",
             "replacement": SHARED_TARGET},
        ]
        return doc


def _by_instance(rows: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in rows:
        instance = row["metric"].get("instance", "")
        assert instance not in out, f"two series for instance {instance!r}: {rows}"
        out[instance] = float(row["value"][1])
    return out


def test_the_scrape_relabelling_makes_both_agents_share_the_target() -> None:
    relabel = SharedTargetStack(["127.0.0.1:1"]).config([])["scrape_configs"][0]["metric_relabel_configs"]
    assert relabel[0]["replacement"] == SHARED_TARGET and relabel[0]["target_label"] == "target"
    # the rules evaluated are the production ones with only the rate window changed
    assert CONFIG != RulesConfig() and replace(CONFIG, rate_window=RulesConfig().rate_window) == RulesConfig()
    assert f"{MBU_RULE}\n" in render(CONFIG)


@pytest.mark.prometheus
@needs_prometheus
def test_each_replica_records_its_own_mbu(tmp_path: Path) -> None:
    rules = tmp_path / "rooflight-1m.rules.yaml"
    rules.write_text(render(CONFIG))
    ports = [(promstack.free_port(), promstack.free_port()) for _ in SEEDS]
    instances = [f"127.0.0.1:{agent}" for agent, _ in ports]
    demos = [start_demo("steady", f"127.0.0.1:{agent}", f"127.0.0.1:{engine}", seed=seed)
             for seed, (agent, engine) in zip(SEEDS, ports)]
    try:
        with SharedTargetStack(instances, [rules]) as prom:
            both = f'count(rooflight_mbu_ratio{{window="1m", target="{SHARED_TARGET}"}}) == 2'
            deadline = time.monotonic() + 90
            scraping_since = None
            while scraping_since is None or time.monotonic() - scraping_since < MIN_SCRAPED_SECONDS:
                for proc in demos:
                    assert proc.poll() is None, f"rooflight demo exited: {stop_process(proc)[-2000:]}"
                if scraping_since is None and prom.query(both):
                    scraping_since = time.monotonic()
                assert scraping_since or time.monotonic() < deadline, f"no {both}: {prom.targets_health()}"
                time.sleep(1.0)

            at = time.time()
            rows = prom.query(f"avg_over_time({MBU_RULE}[{SMOOTH}])", at)
            assert {r["metric"].get("target") for r in rows} == {SHARED_TARGET}, rows
            recorded = _by_instance(rows)
            own = _by_instance(prom.query(f'avg_over_time(rooflight_mbu_ratio{{window="1m"}}[{SMOOTH}])', at))
            fleet = prom.query(f"avg_over_time({FLEET_RULE}[{SMOOTH}])", at)
            print(f"recorded {recorded}, agents {own}, fleet {fleet}")

            assert set(recorded) == set(own) == set(instances), (recorded, own)
            summed = sum(own.values())
            for instance in instances:
                got, want = recorded[instance], own[instance]
                assert want > 0 and abs(got - want) <= TOLERANCE * want, f"{instance}: recorded {got}, agent {want}"
                assert got < 0.75 * summed, f"{instance}: recorded {got} looks like the two replicas summed ({summed})"
            # one series for both replicas: the model and the service scope (here the scrape's job) only
            assert len(fleet) == 1 and set(fleet[0]["metric"]) == {"model", "job"}, fleet
            assert abs(float(fleet[0]["value"][1]) - summed / 2) <= TOLERANCE * summed / 2
    finally:
        for proc in demos:
            stop_process(proc)
    assert all(proc.returncode is not None for proc in demos)
