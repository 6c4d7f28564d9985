"""Where Rooflight's alerts go, and which ones one cause silences: the Alertmanager side, written once.

deploy/generate.py renders it twice: deploy/alertmanager/alertmanager.yml (a whole Alertmanager config, its
receivers placeholders to replace) and the chart's AlertmanagerConfig (prometheus-operator), whose receivers
come from the chart's values.

- **Routes by severity**: `critical` pages (receiver `pager`), `warning` opens a ticket (`ticket`), `info`
  goes nowhere. Grouped by cluster, namespace and model: one notification per model and receiver, its pods
  listed in it (every alert's description names its pod).
- **One cause, one page** (inhibitions, each within the same cluster and namespace):
  a model most of whose engines are down (RooflightModelDown) silences its pods' engine-down tickets and
  every alert of that model an outage causes (its SLO burns, stalls, detectors); an engine down silences
  its pod's stall, SLO, MBU and capacity alerts (the agent keeps the engine's last gauges a few seconds, and
  a pod that serves nothing blinds its histograms); an agent down silences every alert its own series feed,
  for its pod; a lost GPU silences that GPU's heat, throttle and XID alerts, and its pod's engine alerts
  (the engine on it died with it).

The e2e stage (tests/e2e/test_notifications_e2e.py) runs this config in a real Alertmanager, its receivers
pointed at the test's webhook, its waits divided as the rules' are (`--time-scale`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GROUP_BY = ("cluster", "namespace", "model")
# Alertmanager's timings: the first notification of a group waits group_wait for its other alerts; a group
# that changes is notified again after group_interval; one that does not, after repeat_interval.
GROUP_WAIT_S, GROUP_INTERVAL_S = 30, 300
REPEAT_INTERVAL_S = {"pager": 4 * 3600, "ticket": 24 * 3600}
RECEIVERS = {"critical": "pager", "warning": "ticket"}  # `info` and anything else: nowhere
SILENT = "blackhole"
PLACEHOLDERS = {  # replace with your pager's and your ticket queue's integration (pagerduty_configs, ...)
    "pager": "http://pager.example.invalid/rooflight",
    "ticket": "http://tickets.example.invalid/rooflight",
}
SEND_RESOLVED = {"pager": True, "ticket": False}  # a page is closed when it resolves; a ticket by a person

# What each pod's agent feeds: an alert on its own series, silenced when the agent is gone or its engine down.
DETECTORS = ("RooflightHeadOfLineBlocking", "RooflightBatchCapacityCapped", "RooflightBatchAdmissionBound",
             "RooflightLowDecodeMBU")
ENGINE_EFFECTS = ("RooflightEngineStalled", "RooflightSLOHistogramMissing", "RooflightGoodputBudgetBurn",
                  "RooflightSourceDown", *DETECTORS)
GPU_EFFECTS = ("RooflightGPUHot", "RooflightGPUThrottled", "RooflightGPUHardwareXid", "RooflightGPUUncorrectableECC")
MODEL_EFFECTS = ("RooflightEngineDown", "RooflightEngineStartTimeout", "RooflightTTFTBudgetBurn",
                 "RooflightITLBudgetBurn", "RooflightRequestErrorBudgetBurn", "RooflightClientErrorBudgetBurn",
                 *ENGINE_EFFECTS)
POD = ("cluster", "namespace", "pod")


@dataclass(frozen=True)
class Inhibition:
    """While `source` fires, the `targets` that share its `equal` labels are not notified."""

    source: str
    targets: tuple[str, ...]
    equal: tuple[str, ...]
    why: str


INHIBITIONS = (
    Inhibition("RooflightModelDown", MODEL_EFFECTS, ("cluster", "namespace", "model"),
               "a model-wide outage pages once: its pods' tickets and what the outage causes are its"),
    Inhibition("RooflightEngineDown", ENGINE_EFFECTS, POD,
               "an engine down: its pod's stall, SLO, MBU and capacity alerts are its effects"),
    Inhibition("RooflightAgentDown", ("RooflightEngineDown", "RooflightEngineStartTimeout", "RooflightGPUDown",
                                      "RooflightGPULost", *GPU_EFFECTS, *ENGINE_EFFECTS), POD,
               "an agent down: every alert its own series feed, for its pod, is stale"),
    Inhibition("RooflightGPULost", GPU_EFFECTS, (*POD, "uuid"),
               "a lost GPU: its heat, throttle and XID alerts are the same fault"),
    Inhibition("RooflightGPULost", ("RooflightEngineDown", *ENGINE_EFFECTS), POD,
               "a lost GPU: the engine on it died with it"),
)


def _alternation(names: tuple[str, ...]) -> str:
    return "|".join(dict.fromkeys(names))


def _duration(seconds: float, time_scale: int) -> str:
    """`seconds` / `time_scale` as an Alertmanager duration (whole milliseconds: 1500ms, 15s, 12m)."""
    ms = round(seconds * 1000 / time_scale)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def config(time_scale: int = 1, urls: dict[str, str] | None = None) -> dict[str, Any]:
    """The Alertmanager config; `time_scale` divides its waits (as `rooflight rules --time-scale` the
    rules'), `urls` replaces the receivers' placeholders."""
    urls = {**PLACEHOLDERS, **(urls or {})}
    return {
        "route": {
            "receiver": SILENT,
            "group_by": list(GROUP_BY),
            "group_wait": _duration(GROUP_WAIT_S, time_scale),
            "group_interval": _duration(GROUP_INTERVAL_S, time_scale),
            "repeat_interval": _duration(REPEAT_INTERVAL_S["ticket"], time_scale),
            "routes": [
                {"receiver": receiver, "matchers": [f'severity="{severity}"'],
                 "repeat_interval": _duration(REPEAT_INTERVAL_S[receiver], time_scale)}
                for severity, receiver in RECEIVERS.items()
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [f'alertname="{i.source}"'],
             "target_matchers": [f'alertname=~"{_alternation(i.targets)}"'],
             "equal": list(i.equal)}
            for i in INHIBITIONS
        ],
        "receivers": [
            {"name": SILENT},
            *({"name": receiver, "webhook_configs": [{"url": urls[receiver], "send_resolved": SEND_RESOLVED[receiver]}]}
              for receiver in RECEIVERS.values()),
        ],
    }


HEADER = (
    "# Generated by `python -m deploy.generate` from deploy/alertmanager.py. Do not edit; change it and regenerate.\n"
    "# Rooflight's routes and inhibitions (docs/runbooks.md, Alert delivery). Replace the two receivers' webhook\n"
    "# URLs with your pager's and your ticket queue's integrations (pagerduty_configs, opsgenie_configs,\n"
    "# slack_configs, ...); `amtool check-config` this file, `amtool config routes test` an alert's labels.\n"
)


def alertmanager_yml() -> str:
    import yaml

    return HEADER + yaml.safe_dump(config(), sort_keys=False, width=10_000)


def _matcher(text: str) -> dict[str, str]:
    """'alertname=~"A|B"' as an AlertmanagerConfig matcher."""
    m = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', text)
    assert m, text
    return {"name": m.group(1), "matchType": m.group(2), "value": m.group(3)}


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part.title() for part in rest)


def alertmanager_config_spec() -> dict[str, Any]:
    """The same routes and inhibitions as an AlertmanagerConfig's spec (monitoring.coreos.com/v1alpha1),
    without its receivers (the chart's values give them)."""
    c = config()
    route = c["route"]
    return {
        "route": {
            "receiver": route["receiver"],
            "groupBy": route["group_by"],
            "groupWait": route["group_wait"],
            "groupInterval": route["group_interval"],
            "repeatInterval": route["repeat_interval"],
            "routes": [{"receiver": r["receiver"], "matchers": [_matcher(m) for m in r["matchers"]],
                        "repeatInterval": r["repeat_interval"]} for r in route["routes"]],
        },
        "inhibitRules": [{"sourceMatch": [_matcher(m) for m in r["source_matchers"]],
                          "targetMatch": [_matcher(m) for m in r["target_matchers"]],
                          "equal": r["equal"]} for r in c["inhibit_rules"]],
    }


def helm_template() -> str:
    """templates/alertmanagerconfig.yaml: the spec above, receivers from `alertmanagerConfig.receivers`."""
    import yaml

    spec = yaml.safe_dump(alertmanager_config_spec(), sort_keys=False, width=10_000)
    body = "\n".join("  " + line for line in spec.splitlines())
    v = ".Values.alertmanagerConfig"
    return (
        "{{- /* Generated by `python -m deploy.generate` from deploy/alertmanager.py. Do not edit. */}}\n"
        f"{{{{- if {v}.enabled }}}}\n"
        "apiVersion: monitoring.coreos.com/v1alpha1\n"
        "kind: AlertmanagerConfig\n"
        "metadata:\n"
        '  name: {{ include "rooflight.fullname" . }}\n'
        f"  {{{{- with {v}.namespace }}}}\n"
        "  namespace: {{ . }}\n"
        "  {{- end }}\n"
        "  labels:\n"
        '    {{- include "rooflight.labels" . | nindent 4 }}\n'
        "    app.kubernetes.io/component: alerting\n"
        f"    {{{{- with {v}.additionalLabels }}}}\n"
        "    {{- toYaml . | nindent 4 }}\n"
        "    {{- end }}\n"
        "spec:\n"
        f"{body}\n"
        "  receivers:\n"
        f"    - name: {SILENT}\n"
        + "".join(
            f"    - name: {receiver}\n"
            f"      {{{{- toYaml (get {v}.receivers \"{receiver}\") | nindent 6 }}}}\n"
            for receiver in RECEIVERS.values()
        )
        + "{{- end }}\n"
    )
