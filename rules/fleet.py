"""Which rules run where in a fleet: the pod-level rules in each cluster, the fleet rules on a central ruler.

Past one Prometheus, each cluster remote-writes to a shared store (Thanos, Mimir, VictoriaMetrics) whose
ruler evaluates what needs more than one pod. The rules split along the replica labels
(RulesConfig.replica_labels, pod and instance by default):

    pod     every rule that keeps each replica apart: the per-rank records (their level names `target`),
            the per-pod alerts (detectors, engine, GPU, sources, the agent's own scrape) and the proxy's
            per-target goodput. A cluster's Prometheus evaluates them next to its data, so a pod's page
            never waits on remote write, and remote-writes the records with the raw series.
    fleet   every rule that sums over replicas (a `by` without them): the model, phase and role records,
            the SLO error ratios and their burn-rate alerts, the cost and capacity pools, the bucket guard;
            and every rule that reads one of those records. A cluster's Prometheus may hold only part of
            a pool (shards that split its pods) and hours of data where the SLO windows need days, so these
            run where every replica's data and the long retention meet: the central ruler. Each keeps
            `cluster` in its `by`, so a pool in one cluster never adds to its copy in another.

`all` (the default, one Prometheus that scrapes everything) is both, group for group as before. `fleet`
adds RooflightClusterAbsent, which only a ruler that sees several clusters can evaluate: a cluster whose
agents reached the store within the last hour but not within `cluster_absent_for` (its remote write, its
Prometheus or the network between stopped), so its fleet alerts are blind. A cluster in agent mode (no
rules of its own) needs both files on the central ruler.

The fleet groups are named `<name>-fleet...` so a ruler that loads both files into one namespace (Mimir)
keeps both.
"""

from __future__ import annotations

import re
from typing import Any

from rooflight.agent.errors import ConfigError
from rooflight.rules.alerts import alert
from rooflight.rules.config import RulesConfig, check_duration
from rooflight.rules.promql import series
from rooflight.rules.recording import Rule

SCOPES = ("all", "pod", "fleet")
CLUSTER_ALERT = "RooflightClusterAbsent"
# How long a silent cluster is remembered: it alerts from `cluster_absent_for` after its last sample until
# this long after it, then it is a cluster that was removed. Longer costs the ruler an hour of `up` per query.
CLUSTER_MEMORY = "1h"
_BY = re.compile(r"\bby\s*\(([^)]*)\)")


def sums_over_replicas(expr: str, config: RulesConfig) -> bool:
    """Whether `expr` aggregates by a list that leaves every replica label out (a pool, not a pod)."""
    replicas = set(config.replica_labels)
    if not replicas:
        return False
    return any(not replicas & {name.strip() for name in group.split(",")} for group in _BY.findall(expr))


def fleet_rules(groups: list[dict[str, Any]], config: RulesConfig) -> set[int]:
    """The ids of the rules that belong on the central ruler: those that sum over replicas, and those that
    read a record that does (to a fixed point, whatever the groups' order)."""
    rules = [rule for group in groups for rule in group["rules"]]
    fleet = {id(rule) for rule in rules if sums_over_replicas(str(rule["expr"]), config)}
    while True:
        records = [re.escape(str(rule["record"])) for rule in rules if id(rule) in fleet and "record" in rule]
        reads = re.compile(rf"(?<![\w:])({'|'.join(records)})(?![\w:])") if records else None
        more = {id(rule) for rule in rules if reads is not None and reads.search(str(rule["expr"]))} - fleet
        if not more:
            return fleet
        fleet |= more


def fleet_group_name(name: str, config: RulesConfig) -> str:
    """`rooflight-slo.rules` -> `rooflight-fleet-slo.rules`: the fleet half of a group, named apart."""
    prefix = config.rule_name
    return f"{prefix}-fleet{name[len(prefix):]}" if name.startswith(prefix) else f"{prefix}-fleet-{name}"


def scoped(groups: list[dict[str, Any]], config: RulesConfig, scope: str) -> list[dict[str, Any]]:
    """The groups a Prometheus in `scope` loads: every rule (all), the pod-level half of each group (pod),
    or its fleet half under the fleet name plus the cluster meta-alert (fleet). Empty groups are dropped."""
    if scope not in SCOPES:
        raise ConfigError(f"rules scope {scope!r}: one of {', '.join(SCOPES)}")
    if scope == "all":
        return groups
    fleet = fleet_rules(groups, config)
    out = []
    for group in groups:
        rules = [rule for rule in group["rules"] if (id(rule) in fleet) == (scope == "fleet")]
        if rules:
            name = fleet_group_name(group["name"], config) if scope == "fleet" else group["name"]
            out.append({**group, "name": name, "rules": rules})
    if scope == "fleet":
        out.append({"name": f"{config.rule_name}-fleet-meta.alerts", "rules": cluster_alerts(config)})
    return out


def cluster_alerts(config: RulesConfig) -> list[Rule]:
    """RooflightClusterAbsent: a cluster seen within the hour whose agents' `up` has not reached this ruler
    for `cluster_absent_for`. Both sides read a window ([...]), not an instant: the store's lookback (5 m in
    Prometheus, adaptive in VictoriaMetrics) then does not decide when it fires."""
    label = config.cluster_label
    if label not in config.service_labels:
        raise ConfigError(
            f"cluster_label {label!r} must be a topology label that is not a replica label "
            f"({', '.join(config.service_labels) or 'none'}): the fleet rules keep it in every `by`"
        )
    check_duration(config.cluster_absent_for, "cluster_absent_for")
    up = series("up", config.agent_job_selector)
    silent = config.cluster_absent_for
    return [
        alert(
            config,
            CLUSTER_ALERT,
            f"group by ({label}) (max_over_time({up}[{CLUSTER_MEMORY}]))\n"
            f"unless\n"
            f"group by ({label}) (max_over_time({up}[{silent}]))",
            "0s",
            "warning",
            "A cluster's Rooflight data has stopped reaching the fleet's store; its fleet alerts are blind.",
            f"No sample of {up} from {label} {{{{ $labels.{label} }}}} has reached this ruler for {silent}, "
            f"though it had some within the last {CLUSTER_MEMORY}: its Prometheus stopped, or its remote write "
            "or the network to the store did. Until it is back, the SLO burn, capacity and cost rules see none "
            "of its pods. A cluster removed on purpose stops alerting an hour after its last sample.",
            dashboard=("overview", (("cluster", label),)),
        )
    ]
