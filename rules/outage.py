"""An engine down: a ticket for its pod, a page once a model has lost most of its engines.

What users feel is a model's capacity, not one pod: a replica that restarts, or crash-loops while its peers
serve, is a ticket (kube-prometheus makes TargetDown and KubePodCrashLooping warnings for the same reason);
a model that lost more than `model_down_share` of its engines pages, once, whatever the count of its pods.

- `target:rooflight_engine_down:bool` is 1 for an engine whose agent reads every sample of its /metrics as a
  failure, 0 for one that answers, and absent for one that is *starting*: loading its model for the first
  time. Starting is the agent's verdict (`rooflight_source_starting`: nothing has ever listened on the
  engine's port since the agent started), kept only where Prometheus has not seen that pod's engine serve
  within `engine_memory`: an agent restarted during an outage has forgotten the engine it watched,
  Prometheus has not. The series carries the pod's `model`, as Prometheus last saw it within
  `engine_memory` (`target_model:rooflight_engine_model:...`), where it ever saw one.
- **RooflightEngineDown** (warning, per pod): down for at least `engine_down_share` of `engine_down_window`,
  counted in the agent's scrapes (`up{job="rooflight"}`: a scrape that failed is no evidence either way). A
  crash loop's minute up between its restarts does not reset it, one restart that reloads in a few minutes
  stays under it, and neither does an agent whose samples time out for a few minutes.
- **RooflightModelDown** (critical, per model): more than `model_down_share` of the model's engines down
  now, for `engine_down_for`. A model served by one pod pages when it is down; a model of two pages when
  both are. Alertmanager's inhibitions (deploy/alertmanager/) silence the pods' own alerts under it.
- **RooflightEngineStartTimeout** (warning): starting, as above, for longer than `engine_start_budget`.

The down alerts keep firing for `keep_firing_for` after their condition clears (Prometheus 2.42+), so a
crash loop's minute up neither resolves nor re-sends them.
"""

from __future__ import annotations

from rooflight.agent.metrics import names
from rooflight.rules.alerts import PER_SOURCE, SOURCE_WHERE, alert
from rooflight.rules.config import RulesConfig, hold
from rooflight.rules.promql import labels, number, record_name, series, window_suffix
from rooflight.rules.recording import Rule, fleet_by, keep
from rooflight.rules.templates import each_label, same

ENGINE_DOWN = "RooflightEngineDown"
MODEL_DOWN = "RooflightModelDown"
START_TIMEOUT = "RooflightEngineStartTimeout"
ENGINE = 'source="engine"'


def model_record(config: RulesConfig) -> str:
    """Each agent target's model, as Prometheus last saw it (one series per target, value 1)."""
    return record_name(("target", "model"), "rooflight_engine_model", f"last_over_time{window_suffix(config.engine_memory)}")


def down_record() -> str:
    """1 down, 0 up, absent while starting; with the pod's `model` where Prometheus knows it."""
    return "target:rooflight_engine_down:bool"


def _starting(config: RulesConfig) -> str:
    """Engines the agent says are starting that Prometheus has not seen serve within engine_memory."""
    sel, on = config.agent_selector, labels(keep(config, "target"))
    up = series(names.SOURCE_UP, sel, ENGINE)
    return (f"{series(names.SOURCE_STARTING, sel, ENGINE)} == 1\n"
            f"unless on ({on})\n"
            f"max_over_time({up}[{config.engine_memory}]) == 1")


def outage_records(config: RulesConfig) -> list[Rule]:
    sel = config.agent_selector
    on = labels(keep(config, "target"))
    running = series(names.REQUESTS_RUNNING, sel)
    # One model per target: an engine that served two within the memory (a pod reused, not seen in practice)
    # keeps one of them, where a join on two would fail the rule.
    model = (f"topk by ({on}) (1, group by ({labels(keep(config, 'target', 'model'))}) "
             f"(last_over_time({running}[{config.engine_memory}])))")
    raw = f"({series(names.SOURCE_UP, sel, ENGINE)} == bool 0)\nunless on ({on})\n({_starting(config)})"
    down = f"(\n{raw}\n) * on ({on}) group_left (model) {model_record(config)}\nor on ({on})\n(\n{raw}\n)"
    return [{"record": model_record(config), "expr": model}, {"record": down_record(), "expr": down}]


def _down_pods() -> str:
    """The pods of the alert's model whose engines are down now, for the page's text."""
    return each_label(f"{down_record()}{{%[1]s}} == 1", "pod", missing="(none now)")


def outage_alerts(config: RulesConfig) -> list[Rule]:
    w, share = config.engine_down_window, config.engine_down_share
    model_share = config.model_down_share
    by_model = fleet_by(config, "model")
    down = f'{down_record()}{{model!=""}}'
    # the share of the agent's scrapes in the window that read the engine down: a scrape that failed (the agent
    # too busy to answer, restarting) reads nothing, and counts as no evidence of an engine down
    scrapes = f"count_over_time({series('up', config.agent_job_selector)}[{w}])"
    return [
        {**alert(
            config, ENGINE_DOWN,
            f"sum_over_time({down_record()}[{w}])\n/ on ({labels(keep(config))}) group_left\n{scrapes}\n>= {number(share)}",
            config.engine_down_for, "warning",
            "An engine has been down for much of the last minutes; its pod serves nothing meanwhile.",
            f"{SOURCE_WHERE}: every sample of the engine's /metrics failed for {{{{ $value | humanizePercentage }}}} "
            f"of the last {w} (ticket at {share:.0%}): the engine is crash-looping, down, or refuses its agent "
            f"(503, or a page that is not an engine's). {{{{ if $labels.model }}}}Its model "
            f"{{{{ $labels.model }}}} pages as {MODEL_DOWN} once most of its engines are down.{{{{ end }}}}",
            dashboard=("overview", PER_SOURCE),
        ), **hold(config)},
        {**alert(
            config, MODEL_DOWN,
            f"sum by ({by_model}) ({down})\n/\ncount by ({by_model}) ({down})\n> {number(model_share)}",
            config.engine_down_for, "critical",
            "Most engines of a model are down: its users are losing most of its capacity or all of it.",
            f"{{{{ $labels.model }}}}{{{{ if $labels.namespace }}}} in {{{{ $labels.namespace }}}}{{{{ end }}}}: "
            f"{{{{ $value | humanizePercentage }}}} of its engines are down (over {model_share:.0%} pages): "
            f"pods {_down_pods()}. Each pod's own alerts are inhibited under this one.",
            dashboard=("overview", (*same("cluster", "namespace"), ("model", "model"))),
        ), **hold(config)},
        alert(
            config, START_TIMEOUT,
            _starting(config),
            config.engine_start_budget, "warning",
            "An engine has not come up within its load budget.",
            f"{SOURCE_WHERE}: nothing has listened on the engine's port since the agent started "
            f"{config.engine_start_budget} ago, and Prometheus has not seen it serve: longer than a model load "
            "should take. The engine is stuck loading, crash-looping before it binds its port, or the agent "
            "watches the wrong address.",
            dashboard=("overview", PER_SOURCE),
        ),
    ]
