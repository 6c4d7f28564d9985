"""XY chart panels (Grafana's xychart, options as Grafana 11.3+ store them; older versions migrate them).

Owns the plumbing that turns Prometheus queries into x/y point pairs: queries are joined into one frame
(`joinByField`, outer join on a key field) and each series picks its x and y columns by name.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import prometheus, xychart
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import xychart as xym
from grafana_foundation_sdk.models.dashboard import DataTransformerConfig, DynamicConfigValue

from .panels import log10, titled


def _by_name(name: str) -> xychart.MatcherConfig:
    return xychart.MatcherConfig().id("byName").options(name)


def series(name: str, x_field: str, y_field: str) -> xychart.XYSeriesConfig:
    """One XY series: x and y are field names (a query's legend, or `Value #<refId>` for tables)."""
    return (
        xychart.XYSeriesConfig()
        .name(xychart.XychartXYSeriesConfigName().fixed(name))
        .x(xychart.XychartXYSeriesConfigX().matcher(_by_name(x_field)))
        .y(xychart.XychartXYSeriesConfigY().matcher(_by_name(y_field)))
    )


def xy_panel(
    title: str,
    description: str,
    targets: list[prometheus.Dataquery],
    xy_series: list[xychart.XYSeriesConfig],
    *,
    join_field: str,
    unit: str,
    log: bool,
    shows: dict[str, xym.XYShowMode],
) -> xychart.Panel:
    """An xychart over the outer join of its queries on `join_field`; `shows` sets lines/points per y field."""
    p = (
        titled(xychart.Panel(), title, description)
        .unit(unit)
        .mapping(xym.SeriesMapping.MANUAL)
        .series(xy_series)
        .show(xym.XYShowMode.POINTS)
        .point_size(xychart.XychartFieldConfigPointSize().fixed(8))
        .legend(
            common_b.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .tooltip(common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.SINGLE).sort(common.SortOrder.NONE))
        .with_transformation(
            DataTransformerConfig(id_val="joinByField", options={"byField": join_field, "mode": "outer"})
        )
    )
    if log:
        p = p.scale_distribution(log10())
    for field, mode in shows.items():
        p = p.override_by_name(field, [DynamicConfigValue(id_val="custom.show", value=str(mode))])
    for t in targets:
        p = p.with_target(t)
    return p
