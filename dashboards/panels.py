"""Small builders shared by every Rooflight dashboard: datasource, variables, selectors, panels, layout.

Owns the conventions so each dashboard module reads as a list of panels: every panel queries the
`$datasource` variable; every series is filtered by the topology variables (`$cluster`, `$namespace`,
`$pod`, then the agent's own scrape `$job`, `$instance`) and every engine series by `$target`/`$model`/
`$rank`, each variable's values filtered by the ones before it; aggregations keep the topology labels, so
replicas that share a `target` (every sidecar watches its own 127.0.0.1:8000) never mix and legends name
the pod; the engine's own series (scraped from the engine, not the agent) are kept to the pods whose agent
matches the selection; windowed gauges are filtered by `$window`; every target has an explicit refId,
legends are shown, stats reduce to the last value; firing Rooflight alerts are overlaid on every time
series; links to the other Rooflight dashboards carry the selection and the time range; and panels are
placed on the 24-column grid by `Grid` (the SDK's own placement can overflow it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries, xychart
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import prometheus as prom
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from rooflight.agent.metrics import names as n
from rooflight.agent.signals.detectors import detectors

SCHEMA_VERSION = 39  # Grafana 10.4 to 13 load it; 12+ migrate it in the backend
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Labels Prometheus attaches to a scrape, as the rules keep them (rules/config.py TOPOLOGY_LABELS).
# cluster, namespace and pod are shared by the agent's scrape and the engine's own (one pod, two ports);
# job and instance are the agent's scrape alone (the engine's scrape has its own instance).
POD_LABELS: tuple[str, ...] = ("cluster", "namespace", "pod")
SCRAPE_LABELS: tuple[str, ...] = (*POD_LABELS, "job", "instance")
BY_POD = ", ".join(POD_LABELS)
BY_SCRAPE = ", ".join(SCRAPE_LABELS)
BY_TARGET = BY_SCRAPE + ", target"  # one agent's one engine: what the constants are per
BY_SERIES = BY_TARGET + ", model, rank"  # one (target, model, rank) of one agent


def _matchers(*labels: str) -> str:
    """`label=~"$label", ...`: each label matched by the dashboard variable of the same name."""
    return ", ".join(f'{label}=~"${label}"' for label in labels)


# Label selectors, with the dashboard variables in them.
POD = _matchers(*POD_LABELS)
SCRAPE = _matchers(*SCRAPE_LABELS)  # every rooflight_* series
TARGET = SCRAPE + ', target=~"$target"'
MODEL = TARGET + ', model=~"$model"'
ENGINE = MODEL + ', rank=~"$rank"'
WINDOWED = ENGINE + ', window="$window"'
# The proxy's client-side series (rooflight_client_*: `rooflight run` with the proxy on, one scrape with the
# agent's): per target, the engine the proxy fronts named as the agent names it; no model or rank of their own.
CLIENT = TARGET
CLIENT_WINDOWED = CLIENT + ', window="$window"'
GPU = SCRAPE + ', gpu=~"$gpu"'
# The engine's own series (vllm:*, sglang:*) carry model_name, not our target, and come from the engine's
# scrape: filtered by pod here, and by the agent-side variables through `native()`.
NATIVE = POD + ', model_name=~"$model"'
BY_NATIVE = BY_POD + ", instance, model_name"  # one engine's one model
# Service-level records (rules/: the SLO error ratios per model_name, the fleet records per model) sum over
# replicas, so they have no pod. They are filtered by where they run and reach the pod, job and target
# variables through the selected agents of the same cluster and namespace (`service()`, `fleet()`). The
# SLO records keep the engine's scrape job, which need not be the agent's, so they are matched on cluster
# and namespace alone; the fleet records are the agent's own series and keep its job.
SERVICE_LABELS: tuple[str, ...] = ("cluster", "namespace")
FLEET_LABELS: tuple[str, ...] = (*SERVICE_LABELS, "job", "model")
SERVICE = _matchers(*SERVICE_LABELS) + ', model_name=~"$model"'
FLEET = _matchers(*FLEET_LABELS)
# Legends of service-level series: where the service runs and its model.
SERVICE_WHO = "{{cluster}}/{{namespace}} {{model_name}}"
FLEET_WHO = "{{cluster}}/{{namespace}} {{model}}"
# Alerts: a service-level alert (SLO burn) has no pod; `pod=~"$pod|"` keeps it when a pod is chosen.
ALERT = 'alertname=~"Rooflight.*", cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod|"'
# Legends name the pod first; the rest tells a pod's targets, models and ranks apart.
WHO = "{{pod}} {{model}} r{{rank}}"


def sel(selector: str, **extra: str) -> str:
    """`{selector, k="v", ...}` for use after a metric name; empty when there is nothing to match."""
    parts = [p for p in [selector] + [f'{key}="{value}"' for key, value in extra.items()] if p]
    return "{" + ", ".join(parts) + "}" if parts else ""


def native(expr: str) -> str:
    """An expression over the engine's own series, kept to the pods whose agent matches the selection.

    The engine's scrape has no target/model/rank of ours and its own job/instance, so the agent-side
    variables reach it through the pod both scrapes share. `expr` must keep the pod labels (aggregate
    `by (BY_NATIVE)`). Without Kubernetes neither side has them, and PromQL matches the empty values.
    """
    return f"({expr}) and on ({BY_POD}) {n.REQUESTS_RUNNING}{sel(ENGINE)}"


def service(expr: str) -> str:
    """A service-level SLO record's expression, kept to the services (cluster, namespace) of the selected agents.

    `expr` reads records by SERVICE and keeps cluster and namespace; outside Kubernetes both sides lack them
    and PromQL matches the empty values.
    """
    return f"({expr}) and on ({', '.join(SERVICE_LABELS)}) {n.REQUESTS_RUNNING}{sel(ENGINE)}"


def fleet(expr: str) -> str:
    """A fleet record's expression (per model, summed over replicas), kept to the selected agents' models."""
    return f"({expr}) and on ({', '.join(FLEET_LABELS)}) {n.REQUESTS_RUNNING}{sel(ENGINE)}"


def kv_pool_bytes(capacity: str, per_token: str) -> str:
    """The KV pool in bytes, capacity tokens x bytes per token, per (target, model, rank) of each agent.

    `capacity` selects the per-rank capacity, `per_token` the per-model constant (no rank label: a rank
    matcher there would match nothing once a rank is chosen)."""
    return (f"{n.KV_CAPACITY_TOKENS}{sel(capacity)} * on ({BY_TARGET}, model) group_left "
            f"max by ({BY_TARGET}, model) ({n.MODEL_KV_BYTES_PER_TOKEN}{sel(per_token)})")


def query(expr: str, legend: str, ref: str, *, instant: bool = False, table: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
    if instant:
        q = q.instant()
    else:
        q = q.range()
    if table:
        q = q.format(prom.PromQueryFormat.TABLE)
    return q


def _legend() -> common_b.VizLegendOptions:
    return (
        common_b.VizLegendOptions()
        .show_legend(True)
        .display_mode(common.LegendDisplayMode.TABLE)
        .placement(common.LegendPlacement.BOTTOM)
        .calcs(["lastNotNull", "max"])
    )


def _thresholds(steps: list[tuple[float | None, str]]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=v, color=c) for v, c in steps])
    )


P = TypeVar("P", timeseries.Panel, stat.Panel, table.Panel, xychart.Panel)


def titled(panel: P, title: str, description: str) -> P:
    """Every panel's head: its title, what it shows and how to read it, and the `$datasource` it queries."""
    return panel.title(title).description(description).datasource(DS)


def log10() -> common_b.ScaleDistributionConfig:
    """A log-10 axis (ratios that span decades: inflation, intensity)."""
    return common_b.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10)


def ts(
    title: str,
    description: str,
    unit: str,
    targets: list[prometheus.Dataquery],
    *,
    min_val: float | None = 0,
    max_val: float | None = None,
    log: bool = False,
    thresholds: list[tuple[float | None, str]] | None = None,
) -> timeseries.Panel:
    """A time series panel with a table legend showing last and max."""
    p = (
        titled(timeseries.Panel(), title, description)
        .unit(unit)
        .legend(_legend())
        .tooltip(common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    if log:
        p = p.scale_distribution(log10())
    if thresholds:
        p = p.thresholds(_thresholds(thresholds)).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    for t in targets:
        p = p.with_target(t)
    return p


def detector_panel(board: str, title: str, description: str) -> timeseries.Panel:
    """A panel of detector gauges, 1 while true, per series: one line for each detector whose declaration
    draws it in this board's panel of this title (agent/signals/detectors/), ordered by its refId."""
    lines = [(d.panel, d.flag.metric) for d in detectors() if d.panel and (d.panel.board, d.panel.title) == (board, title)]
    targets = [query(f"{metric}{sel(ENGINE)}", f"{WHO} {panel.legend}".rstrip(), panel.ref)
               for panel, metric in sorted(lines, key=lambda line: line[0].ref)]
    return ts(title, description, "short", targets, max_val=1)


def single(
    title: str,
    description: str,
    unit: str,
    target: prometheus.Dataquery,
    *,
    thresholds: list[tuple[float | None, str]] | None = None,
    decimals: float | None = None,
) -> stat.Panel:
    """A stat panel showing the last value of one instant query."""
    p = (
        titled(stat.Panel(), title, description)
        .unit(unit)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.VALUE)
        .with_target(target)
    )
    if thresholds:
        p = p.thresholds(_thresholds(thresholds))
    if decimals is not None:
        p = p.decimals(decimals)
    return p


def info_table(title: str, description: str, target: prometheus.Dataquery, hide: tuple[str, ...]) -> table.Panel:
    """A table of an info metric's series, one row per series and one column per label: the instant
    query's rows, without the columns that say nothing here (`hide`: the time, the value 1, the name)."""
    organize = DataTransformerConfig(
        id_val="organize",
        options={"excludeByName": {column: True for column in hide}, "indexByName": {}, "renameByName": {}},
    )
    return (
        titled(table.Panel(), title, description)
        .with_target(target)
        .with_transformation(organize)
        .show_header(True)
        .filterable(True)
    )


def alert_table(title: str, description: str, expr: str, columns: tuple[tuple[str, str], ...]) -> table.Panel:
    """A table of firing alerts, one row each: `columns` ((label or Value, header), in order) shown, every
    other column hidden; the value is when the alert became active (ms since the epoch), shown as "since"."""
    shown = {name for name, _ in columns}
    organize = DataTransformerConfig(
        id_val="organize",
        options={"excludeByName": {}, "includeByName": {name: True for name in shown},
                 "indexByName": {name: i for i, (name, _) in enumerate(columns)},
                 "renameByName": {name: header for name, header in columns}},
    )
    return (
        titled(table.Panel(), title, description)
        .with_target(query(expr, "", "A", instant=True, table=True))
        .with_transformation(organize)
        .unit("dateTimeFromNow")
        .show_header(True)
        .filterable(True)
    )


@dataclass
class Grid:
    """Left-to-right placement on Grafana's 24-column grid; wraps before a panel would overflow."""

    x: int = 0
    y: int = 0
    row_height: int = 0
    next_id: int = 1
    placed: list[cogbuilder.Builder[Any]] = field(default_factory=list)

    def add(self, panel: Any, w: int, h: int) -> None:
        if not 0 < w <= 24:
            raise ValueError(f"panel width {w} is not within the 24-column grid")
        if self.x + w > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        panel.grid_pos(GridPos(h=h, w=w, x=self.x, y=self.y)).id(self.next_id)
        self.next_id += 1
        self.x += w
        self.row_height = max(self.row_height, h)
        self.placed.append(panel)

    def row(self, title: str) -> None:
        """A full-width row header on a line of its own."""
        if self.x:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        row = dashboard.Row(title).grid_pos(GridPos(h=1, w=24, x=0, y=self.y)).id(self.next_id)
        self.next_id += 1
        self.y += 1
        self.placed.append(row)


def _query_var(name: str, label: str, expr: str, description: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .description(description)
        .query(expr)
        .datasource(DS)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(VariableOption(selected=True, text=["All"], value=["$__all"]))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def _custom_var(name: str, label: str, values: list[str], default: str, description: str) -> dashboard.CustomVariable:
    return (
        dashboard.CustomVariable(name)
        .label(label)
        .description(description)
        .values(",".join(values))
        .current(VariableOption(selected=True, text=default, value=default))
        .options([VariableOption(selected=v == default, text=v, value=v) for v in values])
    )


# The scrape-side variables, outermost first, each read from rooflight_build_info (every agent has it,
# engine up or down) and filtered by the ones before it.
_TOPOLOGY_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("cluster", "Cluster", "The cluster label your Prometheus, Thanos or Mimir puts on every series (empty: All)."),
    ("namespace", "Namespace", "Kubernetes namespace of the pod the agent runs in (empty outside Kubernetes)."),
    ("job", "Job", "Prometheus scrape job of the agent (a PodMonitor's is namespace/name)."),
    ("pod", "Pod", "The pod: the agent and its engine share it; replicas share target and model, not this."),
    ("instance", "Instance", "The agent's scrape address (host:port); outside Kubernetes it stands for the pod."),
)


def topology_variables() -> list[dashboard.QueryVariable]:
    """cluster, namespace, job, pod, instance: each variable's values filtered by the ones before it."""
    out: list[dashboard.QueryVariable] = []
    before: list[str] = []
    for name, label, description in _TOPOLOGY_VARIABLES:
        expr = f"label_values({n.BUILD_INFO}{sel(_matchers(*before))}, {name})"
        out.append(_query_var(name, label, expr, description))
        before.append(name)
    return out


def engine_variables() -> list[cogbuilder.Builder[Any]]:
    """datasource, the topology, target, model, rank, window: the variables every dashboard has, chained."""
    running = n.REQUESTS_RUNNING
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        *topology_variables(),
        _query_var("target", "Target", f"label_values({running}{sel(SCRAPE)}, target)",
                   "Engine endpoint as the agent names it; replicas' sidecars may share one, pods tell them apart."),
        _query_var("model", "Model", f"label_values({running}{sel(TARGET)}, model)", "Served model name."),
        _query_var("rank", "Rank", f"label_values({running}{sel(MODEL)}, rank)", "Data-parallel rank."),
        _custom_var("window", "Window", ["10s", "1m", "5m"], "1m", "Window of the agent's derived gauges."),
    ]


def custom_variable(name: str, label: str, values: list[str], default: str, description: str) -> dashboard.CustomVariable:
    return _custom_var(name, label, values, default, description)


def gpu_variable() -> dashboard.QueryVariable:
    return _query_var("gpu", "GPU", f"label_values({n.GPU_INFO}{sel(SCRAPE)}, gpu)",
                      "NVML GPU index, among the GPUs the selected agents export.")


def dtype_variable() -> dashboard.QueryVariable:
    v = _query_var(
        "dtype", "Peak dtype", f"label_values({n.GPU_PEAK_FLOPS}{sel(TARGET)}, dtype)",
        "Which dense peak FLOP/s the roof uses (the model's compute dtype).",
    )
    return v.multi(False).include_all(False).current(VariableOption(selected=True, text="bf16", value="bf16"))


def alert_annotation() -> dashboard.AnnotationQuery:
    """Firing Rooflight alerts of the selection, overlaid on every time series (a region while firing).

    The query sits in `target` (what Grafana's Prometheus annotation editor saves); the title, text and
    tag formats are the Prometheus annotation's own fields on the annotation itself.
    """
    return (
        dashboard.AnnotationQuery()
        .name("Rooflight alerts")
        .datasource(DS)
        .enable(True)
        .hide(False)
        .icon_color("red")
        .target(prometheus.Dataquery().expr(f'ALERTS{{{ALERT}, alertstate="firing"}}').ref_id("Anno").range())
        .title_format("{{alertname}}")
        .text_format("{{alertname}} on {{pod}} {{instance}} {{model}} r{{rank}} ({{severity}})")
        .tag_keys("alertname,severity,pod")
        .use_value_for_time(False)
    )


def dashboard_links() -> list[dashboard.DashboardLink]:
    """Links to every Rooflight dashboard (by tag), carrying the variables' values and the time range."""
    return [
        dashboard.DashboardLink("Rooflight")
        .type(DashboardLinkType.DASHBOARDS)
        .tags(["rooflight"])
        .as_dropdown(False)
        .include_vars(True)
        .keep_time(True)
        .target_blank(False)
        .icon("external link")
        .tooltip("The other Rooflight dashboards, with this selection and time range")
    ]


def build(uid: str, title: str, description: str, variables: list[Any], grid: Grid) -> dict[str, Any]:
    """The dashboard as a plain dict (classic JSON model, schemaVersion 39)."""
    d = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["rooflight", "llm-serving"])
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .time("now-30m", "now")
        .timezone("browser")
        .editable()
        .links(dashboard_links())
        .annotation(alert_annotation())
    )
    for v in variables:
        d = d.with_variable(v)
    model = d.build()
    model.schema_version = SCHEMA_VERSION
    # Panels are placed by Grid (ids and gridPos fixed), so add them after the SDK's own layout code.
    model.panels = [p.build() for p in grid.placed]
    out: dict[str, Any] = json.loads(JSONEncoder().encode(model))
    for var in out["templating"]["list"]:
        if var["type"] != "interval":  # the SDK writes interval-only fields on every variable
            for key in ("auto", "auto_count", "auto_min"):
                var.pop(key, None)
    # The SDK writes its default placement, "inControlsMenu", which Grafana 12+ reads as "hide it in the
    # controls menu"; without it links and the annotation toggle show above the panels, as in 10.4 and 11.
    for item in (*out["links"], *out["annotations"]["list"]):
        item.pop("placement", None)
    for anno in out["annotations"]["list"]:
        anno.pop("builtIn", None)  # 0 is the default: not Grafana's built-in annotation
    return out
