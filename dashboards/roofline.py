"""Roofline: where decode and prefill sit against the GPU's two roofs, live.

attainable FLOP/s = min(peak compute, intensity x bandwidth); the ridge is peak / bandwidth (~295 FLOP/byte
on an H100 SXM). Decode sits far left of the ridge (intensity ~ batch, less as the KV cache grows), so it
is judged by MBU; prefill sits right of it (intensity ~ prompt length), so it is judged by MFU.
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import xychart as xym

from rooflight.agent.metrics import names as n

from .panels import (
    BY_TARGET,
    ENGINE,
    SCRAPE_LABELS,
    TARGET,
    WHO,
    WINDOWED,
    Grid,
    build,
    dtype_variable,
    engine_variables,
    query,
    sel,
    ts,
)
from .xy import series, xy_panel

UID = "rooflight-roofline"

# Per-GPU constants for the selected targets (one value per target of each agent: replicas share targets).
PEAK = f'max by ({BY_TARGET}) ({n.GPU_PEAK_FLOPS}{sel(TARGET, dtype="$dtype")})'
BANDWIDTH = f"max by ({BY_TARGET}) ({n.GPU_PEAK_BANDWIDTH}{sel(TARGET)})"
_POINT_LABELS = (*SCRAPE_LABELS, "target")  # what a roof is per; a decode point adds model and rank
RIDGE = f"{PEAK} / {BANDWIDTH}"

# The roof is drawn through three points per target: far left on the memory roof (ridge / 1024), the
# ridge, and right on the compute roof (16 x ridge). On log-log axes the memory roof is a straight line,
# so straight segments between these points are the exact roofline.
_ROOF = (("roof-left", 2.0**-10, 2.0**-10), ("ridge", 1.0, 1.0), ("roof-right", 16.0, 1.0))


def _keyed(expr: str, kind: str, *labels: str) -> str:
    """Give each series a `point` label (kind + its identifying labels) to join x and y queries on."""
    tagged = f'label_replace({expr}, "point_kind", "{kind}", "", "")'
    return f'label_join({tagged}, "point", " ", "point_kind", {", ".join(f"{chr(34)}{l}{chr(34)}" for l in labels)})'


def _roof(axis: str) -> str:
    parts = []
    for kind, x_scale, y_scale in _ROOF:
        expr = f"({RIDGE}) * {x_scale!r}" if axis == "x" else f"{PEAK} * {y_scale!r}"
        parts.append(_keyed(expr, kind, *_POINT_LABELS))
    return " or ".join(parts)


def _decode_point(axis: str) -> str:
    if axis == "x":
        expr = f"{n.DECODE_INTENSITY}{sel(WINDOWED)}"
    else:  # achieved FLOP/s per GPU = decode MFU x per-GPU peak
        expr = f'sum without (phase) ({n.MFU}{sel(WINDOWED, phase="decode")}) * on ({BY_TARGET}) group_left {PEAK}'
    return _keyed(expr, "decode", *_POINT_LABELS, "model", "rank")


def dashboard() -> dict[str, Any]:
    g = Grid()
    g.row("Utilization by phase")
    g.add(ts(
        "Decode: MBU (and MFU)",
        "MBU = bytes decode must stream per second (weights + live KV, every step) / peak HBM bandwidth of the "
        "model's GPUs. Judge decode by MBU: 60-80% is healthy, and 70% means at most ~1.4x headroom from kernels. "
        "Decode MFU is shown for contrast; it is tiny by nature (batch-1 decode is ~0.3% of peak), do not chase it.",
        "percentunit", [
            query(f"{n.MBU}{sel(WINDOWED)}", f"{WHO} MBU", "A"),
            query(f'{n.MFU}{sel(WINDOWED, phase="decode")}', f"{WHO} MFU decode", "B"),
        ], max_val=1, thresholds=[(None, "transparent"), (0.6, "green")],
    ), 12, 8)
    g.add(ts(
        "Prefill: MFU",
        "MFU = prompt tokens/s x 2 x active params / peak dense FLOP/s of the model's GPUs. Prefill is "
        "compute-bound once prompts pass the ridge (~295 tokens on an H100), so judge it by MFU: 40-60% is strong. "
        "Short prompts stay memory-bound and read low here by nature.",
        "percentunit", [query(f'{n.MFU}{sel(WINDOWED, phase="prefill")}', f"{WHO} MFU prefill", "A")],
        max_val=1, thresholds=[(None, "transparent"), (0.4, "green")],
    ), 12, 8)

    g.row("Operating point")
    roofline = xy_panel(
        "Roofline: live decode operating point",
        "x: arithmetic intensity (FLOP per byte streamed from HBM); y: attainable FLOP/s per GPU. The roof is "
        "min(peak, intensity x bandwidth) with its corner at the ridge (peak / bandwidth). The point is decode "
        "now: x = the decode step's FLOPs (2P a token + its attention) / its bytes (weights read + live KV), "
        "y = decode MFU x peak. Left of the ridge it is memory-bound; raising batch (or quantizing) moves it right, "
        "growing KV caches move it left.",
        [
            query(_roof("x"), "", "A", instant=True, table=True),
            query(_roof("y"), "", "B", instant=True, table=True),
            query(_decode_point("x"), "", "C", instant=True, table=True),
            query(_decode_point("y"), "", "D", instant=True, table=True),
        ],
        [series("roof", "Value #A", "Value #B"), series("decode", "Value #C", "Value #D")],
        join_field="point", unit="none", log=True,
        shows={"Value #B": xym.XYShowMode.POINTS_AND_LINES, "Value #D": xym.XYShowMode.POINTS},
    )
    g.add(roofline, 12, 10)
    g.add(xy_panel(
        "Decode intensity vs batch",
        "Each point is one moment in the time range: x = running batch B, y = effective decode intensity. "
        "Weights amortize over the batch, so intensity climbs ~B while caches are small, then bends below B as "
        "each sequence's own KV (streamed in full every step) grows. Pick one pod, target, model and rank: with "
        "several, each moment shows the largest batch and the largest intensity among them.",
        [
            query(f"max({n.REQUESTS_RUNNING}{sel(ENGINE)})", "batch", "A"),
            query(f"max({n.DECODE_INTENSITY}{sel(WINDOWED)})", "intensity", "B"),
        ],
        [series("decode", "batch", "intensity")],
        join_field="Time", unit="none", log=False, shows={},
    ), 12, 10)
    g.add(ts(
        "Decode intensity vs ridge",
        "Decode's effective intensity (FLOP/byte) against the ridge of its GPU. Far below the ridge (the normal "
        "case) decode is memory-bound and MBU is the ratio that matters; reaching the ridge needs a batch in "
        "the hundreds.",
        "none", [
            query(f"{n.DECODE_INTENSITY}{sel(WINDOWED)}", f"{WHO} decode", "A"),
            query(RIDGE, "{{pod}} ridge {{target}}", "B"),
        ], log=True, min_val=None,
    ), 24, 8)

    return build(UID, "Rooflight / Roofline",
                 "MBU and MFU per phase, and the live decode operating point on the roofline.",
                 engine_variables() + [dtype_variable()], g)
