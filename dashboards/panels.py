"""Small builders shared by every Rooflight dashboard: datasource, variables, selectors, panels, layout.

Owns the conventions so each dashboard module reads as a list of panels: every panel queries the
`$datasource` variable, every engine series is filtered by `$target`/`$model`/`$rank`, windowed gauges
by `$window`, every target has an explicit refId, legends are shown, stats reduce to the last value,
and panels are placed on the 24-column grid by `Grid` (the SDK's own placement can overflow it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import prometheus as prom
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    GridPos,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

SCHEMA_VERSION = 39  # Grafana 10.4 to 13 load it; 12+ migrate it in the backend
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label selectors, with the dashboard variables in them.
ENGINE = 'target=~"$target", model=~"$model", rank=~"$rank"'
WINDOWED = ENGINE + ', window="$window"'
TARGET = 'target=~"$target"'
GPU = 'gpu=~"$gpu"'
VLLM = 'model_name=~"$model"'  # vLLM's own series carry model_name, not our target


def sel(selector: str, **extra: str) -> str:
    """`{selector, k="v", ...}` for use after a metric name."""
    parts = [selector] + [f'{key}="{value}"' for key, value in extra.items()]
    return "{" + ", ".join(p for p in parts if p) + "}"


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
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
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
        p = p.scale_distribution(common_b.ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(10))
    if thresholds:
        p = p.thresholds(_thresholds(thresholds)).thresholds_style(
            common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE)
        )
    for t in targets:
        p = p.with_target(t)
    return p


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
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
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


def engine_variables() -> list[cogbuilder.Builder[Any]]:
    """datasource, target, model, rank, window: the variables every engine-side dashboard has."""
    running = "rooflight_requests_running"
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        _query_var("target", "Target", f"label_values({running}, target)", "Engine endpoint the agent scrapes."),
        _query_var("model", "Model", f'label_values({running}{{target=~"$target"}}, model)', "Served model name."),
        _query_var(
            "rank", "Rank", f'label_values({running}{{target=~"$target", model=~"$model"}}, rank)', "Data-parallel rank."
        ),
        _custom_var("window", "Window", ["10s", "1m", "5m"], "1m", "Window of the agent's derived gauges."),
    ]


def custom_variable(name: str, label: str, values: list[str], default: str, description: str) -> dashboard.CustomVariable:
    return _custom_var(name, label, values, default, description)


def gpu_variable() -> dashboard.QueryVariable:
    return _query_var("gpu", "GPU", "label_values(rooflight_gpu_info, gpu)", "NVML GPU index.")


def dtype_variable() -> dashboard.QueryVariable:
    v = _query_var(
        "dtype", "Peak dtype", 'label_values(rooflight_gpu_peak_flops{target=~"$target"}, dtype)',
        "Which dense peak FLOP/s the roof uses (the model's compute dtype).",
    )
    return v.multi(False).include_all(False).current(VariableOption(selected=True, text="bf16", value="bf16"))


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
    return out
