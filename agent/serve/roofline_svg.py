"""The roofline chart as a standalone SVG, rendered in pure Python from one target's status data.

Log-log: arithmetic intensity (FLOP/byte) across, FLOP/s up. The memory roof (intensity x peak bandwidth)
rises to the ridge point and meets the flat compute roof (peak FLOP/s); the live decode and prefill
points and the ceilings for the current batch and the batch cap (the step model's decode step, what `rooflight
plan` prints for them) sit under them. The same markup is served
at /roofline.svg (a Grafana text panel, a wiki) and inlined into the status page, so both show one chart.

Every text is escaped, and characters XML 1.0 forbids (C0 controls but tab and line breaks, C1 controls,
lone surrogates, U+FFFE/U+FFFF) are shown as U+FFFD, so a model or target name holding them cannot make
the chart ill-formed (a browser then draws nothing); colours are the Okabe-Ito palette (colour-blind safe) and follow the reader's
light or dark scheme; markers differ by shape as well as colour. Elements carry `data-intensity` and
`data-flops` so a test (or a script) can read the plotted values back.
"""

from __future__ import annotations

import math
import re
from html import escape
from typing import Any, Iterable, Mapping

WIDTH, HEIGHT = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 30, 48

STYLE = """
.rl-roofline{--rl-bg:#ffffff;--rl-fg:#1b1b1b;--rl-muted:#5f5f5f;--rl-grid:#dcdcdc;--rl-decode:#0072B2;
--rl-prefill:#D55E00;--rl-ceiling:#009E73;--rl-cap:#CC79A7;font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:12px}
@media (prefers-color-scheme:dark){.rl-roofline{--rl-bg:#1c1f22;--rl-fg:#ececec;--rl-muted:#a8a8a8;--rl-grid:#3b3b3b;
--rl-decode:#56B4E9;--rl-prefill:#E69F00;--rl-ceiling:#009E73;--rl-cap:#CC79A7}}
.rl-roofline .rl-bg{fill:var(--rl-bg)}
.rl-roofline text{fill:var(--rl-fg)}
.rl-roofline .rl-muted{fill:var(--rl-muted)}
.rl-roofline .rl-grid{stroke:var(--rl-grid);stroke-width:1}
.rl-roofline .rl-axis{stroke:var(--rl-muted);stroke-width:1}
.rl-roofline .rl-roof{stroke:var(--rl-fg);stroke-width:2.5;fill:none}
.rl-roofline .rl-ridge{stroke:var(--rl-muted);stroke-width:1;stroke-dasharray:4 4}
.rl-roofline .rl-decode{fill:var(--rl-decode);stroke:var(--rl-fg);stroke-width:1}
.rl-roofline .rl-prefill{fill:var(--rl-prefill);stroke:var(--rl-fg);stroke-width:1}
.rl-roofline .rl-ceiling{fill:none;stroke:var(--rl-ceiling);stroke-width:2}
.rl-roofline .rl-cap{fill:none;stroke:var(--rl-cap);stroke-width:2}
.rl-roofline .rl-gap{stroke:var(--rl-ceiling);stroke-width:1.5;stroke-dasharray:2 3}
"""


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def _text(value: object) -> str:
    """`value` as XML character data or an attribute value: escaped, and characters XML forbids replaced."""
    return escape(_NOT_XML.sub("\ufffd", str(value)))


def _log(x: float) -> float:
    return math.log10(x)


def _positive(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _points(target: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(kind, series label, point) of every plottable point: decode, prefill and the plan's ceilings."""
    series = target.get("series") or []
    out = []
    for s in series:
        label = f"{s['model']} rank {s['rank']}" if len(series) > 1 else ""
        op = s.get("operating") or {}
        for kind in ("decode", "prefill"):
            if op.get(kind):
                out.append((kind, label, op[kind]))
        for c in s.get("ceilings") or []:
            out.append(("ceiling" if c["kind"] == "batch" else "cap", label, c))
    return [(k, lbl, p) for k, lbl, p in out if _positive([p.get("intensity")]) and _positive([p.get("flops")])]


def axis_ranges(roof: Mapping[str, Any], points: list[tuple[str, str, Mapping[str, Any]]]) -> tuple[float, ...]:
    """(x_lo, x_hi, y_lo, y_hi) in log10 units: whole decades across, the roofs and every point inside."""
    ridge, peak, bw = roof["ridge"], roof["peak_flops"], roof["peak_bandwidth"]
    xs = [p["intensity"] for _, _, p in points]
    ys = [p["flops"] for _, _, p in points]
    x_lo = math.floor(_log(min([ridge / 100.0, *[x / 2.0 for x in xs]])))
    x_hi = math.ceil(_log(max([ridge * 10.0, *[x * 2.0 for x in xs]])))
    y_lo = math.floor(_log(min([10.0 ** x_lo * bw, *[y / 2.0 for y in ys]])))
    y_hi = _log(max([peak, *ys]) * 2.5)
    return float(x_lo), float(x_hi), float(y_lo), y_hi


class _Scale:
    def __init__(self, ranges: tuple[float, ...]) -> None:
        self.x_lo, self.x_hi, self.y_lo, self.y_hi = ranges

    def x(self, intensity: float) -> float:
        span = self.x_hi - self.x_lo
        return LEFT + (_log(intensity) - self.x_lo) / span * (WIDTH - LEFT - RIGHT)

    def y(self, flops: float) -> float:
        span = self.y_hi - self.y_lo
        return HEIGHT - BOTTOM - (_log(flops) - self.y_lo) / span * (HEIGHT - TOP - BOTTOM)


def si(value: float, unit: str = "") -> str:
    """3 significant digits with an SI prefix: 9.89e14 -> '989 T', 0.5 -> '0.5'."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}{' ' + unit if unit else ''}"
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g}{' ' + unit if unit else ''}"


def _tick_label(exponent: int, unit: str = "") -> str:
    return si(10.0 ** exponent, unit).replace(" ", "")


def _f(v: float) -> str:
    return f"{v:.1f}"


def _grid(scale: _Scale) -> list[str]:
    out = []
    for e in range(int(scale.x_lo), int(scale.x_hi) + 1):
        x = scale.x(10.0 ** e)
        out.append(f'<line class="rl-grid" x1="{_f(x)}" y1="{TOP}" x2="{_f(x)}" y2="{HEIGHT - BOTTOM}"/>')
        out.append(f'<text class="rl-muted" x="{_f(x)}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                   f'{_text(_tick_label(e))}</text>')
    for e in range(math.ceil(scale.y_lo), math.floor(scale.y_hi) + 1):
        y = scale.y(10.0 ** e)
        out.append(f'<line class="rl-grid" x1="{LEFT}" y1="{_f(y)}" x2="{WIDTH - RIGHT}" y2="{_f(y)}"/>')
        out.append(f'<text class="rl-muted" x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">'
                   f'{_text(_tick_label(e))}</text>')
    out.append(f'<line class="rl-axis" x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" '
               f'y2="{HEIGHT - BOTTOM}"/>')
    out.append(f'<line class="rl-axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}"/>')
    out.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT - 10}" text-anchor="middle">'
               'arithmetic intensity (FLOP/byte)</text>')
    out.append(f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2:.1f})">attained FLOP/s</text>')
    return out


def _roofs(scale: _Scale, roof: Mapping[str, Any]) -> list[str]:
    ridge, peak, bw = roof["ridge"], roof["peak_flops"], roof["peak_bandwidth"]
    x0 = 10.0 ** scale.x_lo
    x1 = 10.0 ** scale.x_hi
    rx, ry = scale.x(ridge), scale.y(peak)
    return [
        f'<polyline class="rl-roof" data-peak-flops="{peak!r}" data-peak-bandwidth="{bw!r}" '
        f'points="{_f(scale.x(x0))},{_f(scale.y(x0 * bw))} {_f(rx)},{_f(ry)} {_f(scale.x(x1))},{_f(ry)}">'
        f'<title>memory roof {_text(si(bw, "B/s"))}, compute roof {_text(si(peak, "FLOP/s"))}</title></polyline>',
        f'<line class="rl-ridge" data-intensity="{ridge!r}" x1="{_f(rx)}" y1="{_f(ry)}" x2="{_f(rx)}" '
        f'y2="{HEIGHT - BOTTOM}"/>',
        f'<text class="rl-muted" x="{_f(rx + 4)}" y="{HEIGHT - BOTTOM - 6}">ridge {_text(si(ridge))} FLOP/B</text>',
        f'<text class="rl-muted" x="{_f(scale.x(x1) - 4)}" y="{_f(ry - 6)}" text-anchor="end">'
        f'compute roof {_text(si(peak, "FLOP/s"))}</text>',
        f'<text class="rl-muted" x="{_f(scale.x(x0) + 6)}" y="{_f(scale.y(x0 * bw) - 8)}">'
        f'memory roof {_text(si(bw, "B/s"))}</text>',
    ]


def _marker(kind: str, x: float, y: float) -> str:
    if kind == "decode":
        return f'<circle class="rl-decode" cx="{_f(x)}" cy="{_f(y)}" r="6"'
    if kind == "prefill":
        return (f'<path class="rl-prefill" d="M{_f(x)} {_f(y - 8)} L{_f(x + 8)} {_f(y)} L{_f(x)} {_f(y + 8)} '
                f'L{_f(x - 8)} {_f(y)} Z"')
    if kind == "ceiling":
        return f'<rect class="rl-ceiling" x="{_f(x - 6)}" y="{_f(y - 6)}" width="12" height="12"'
    return f'<path class="rl-cap" d="M{_f(x)} {_f(y - 8)} L{_f(x + 7)} {_f(y + 6)} L{_f(x - 7)} {_f(y + 6)} Z"'


def _describe(kind: str, label: str, p: Mapping[str, Any]) -> str:
    where = f"{si(p['intensity'])} FLOP/B, {si(p['flops'], 'FLOP/s')}"
    if kind in ("ceiling", "cap"):
        what = f"plan ceiling at batch {p['batch']}"
        return f"{what}{' (' + label + ')' if label else ''}: {where}, {si(p['tokens_per_second'])} tok/s"
    return f"{kind}{' (' + label + ')' if label else ''}: {where}"


def _short(kind: str, p: Mapping[str, Any]) -> str:
    if kind == "ceiling":
        return f"plan @ batch {p['batch']}"
    if kind == "cap":
        return f"plan @ cap {p['batch']}"
    return kind


Box = tuple[float, float, float, float]  # x0, y0, x1, y1
CHAR_WIDTH = 6.6  # average advance of a 12 px sans-serif character, for laying labels out


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_at(x: float, y: float, text: str, taken: list[Box]) -> tuple[float, float, str]:
    """Right, left, above or below the marker: the first place clear of the markers and labels so far."""
    w = len(text) * CHAR_WIDTH
    options = ((x + 10, y + 4, "start", x + 10), (x - 10, y + 4, "end", x - 10 - w),
               (x, y - 12, "middle", x - w / 2), (x, y + 20, "middle", x - w / 2))
    for tx, ty, anchor, left in options:
        box = (left, ty - 10, left + w, ty + 3)
        inside = LEFT <= box[0] and box[2] <= WIDTH - RIGHT and TOP <= box[1] and box[3] <= HEIGHT - BOTTOM
        if inside and not any(_overlaps(box, t) for t in taken):
            taken.append(box)
            return tx, ty, anchor
    return options[0][:3]


def _plotted(scale: _Scale, points: list[tuple[str, str, Mapping[str, Any]]]) -> list[str]:
    out = []
    decode = {lbl: p for k, lbl, p in points if k == "decode"}
    for k, lbl, p in points:  # the gap between a decode point and its ceiling: what the batch leaves unused
        if k == "ceiling" and lbl in decode:
            x, y0, y1 = scale.x(decode[lbl]["intensity"]), scale.y(decode[lbl]["flops"]), scale.y(p["flops"])
            out.append(f'<line class="rl-gap" x1="{_f(x)}" y1="{_f(y0)}" x2="{_f(x)}" y2="{_f(y1)}"/>')
    order = {"cap": 0, "ceiling": 1, "prefill": 2, "decode": 3}  # decode drawn last, on top
    placed = sorted(points, key=lambda t: order[t[0]])
    taken: list[Box] = [(scale.x(p["intensity"]) - 8, scale.y(p["flops"]) - 8, scale.x(p["intensity"]) + 8,
                         scale.y(p["flops"]) + 8) for _, _, p in placed]
    labels = []
    for k, lbl, p in sorted(placed, key=lambda t: -order[t[0]]):  # decode's label first, it matters most
        x, y = scale.x(p["intensity"]), scale.y(p["flops"])
        text = _short(k, p) + (f" ({lbl})" if lbl and k == "decode" else "")
        tx, ty, anchor = _label_at(x, y, text, taken)
        labels.append(f'<text x="{_f(tx)}" y="{_f(ty)}" text-anchor="{anchor}">{_text(text)}</text>')
    for k, lbl, p in placed:
        x, y = scale.x(p["intensity"]), scale.y(p["flops"])
        data = (f' data-kind="{k}" data-series="{_text(lbl)}" data-intensity="{p["intensity"]!r}"'
                f' data-flops="{p["flops"]!r}"')
        out.append(f'<g class="rl-point rl-point-{k}"{data}>{_marker(k, x, y)}>'
                   f'<title>{_text(_describe(k, lbl, p))}</title></{_tag(k)}></g>')
    return out + labels


def _tag(kind: str) -> str:
    return {"decode": "circle", "ceiling": "rect"}.get(kind, "path")


def _legend() -> str:
    y = 14
    return (f'<g class="rl-legend">'
            f'<circle class="rl-decode" cx="{LEFT + 6}" cy="{y}" r="5"/>'
            f'<text x="{LEFT + 16}" y="{y + 4}">decode</text>'
            f'<path class="rl-prefill" d="M{LEFT + 82} {y - 6} L{LEFT + 88} {y} L{LEFT + 82} {y + 6} '
            f'L{LEFT + 76} {y} Z"/>'
            f'<text x="{LEFT + 94}" y="{y + 4}">prefill</text>'
            f'<rect class="rl-ceiling" x="{LEFT + 150}" y="{y - 5}" width="10" height="10"/>'
            f'<text x="{LEFT + 166}" y="{y + 4}">plan ceiling, current batch</text>'
            f'<path class="rl-cap" d="M{LEFT + 340} {y - 6} L{LEFT + 346} {y + 5} L{LEFT + 334} {y + 5} Z"/>'
            f'<text x="{LEFT + 352}" y="{y + 4}">plan ceiling, batch cap</text></g>')


def _frame(body: list[str], title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="rl-roofline" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_text(title)}">'
            f'<title>{_text(title)}</title><style>{STYLE}</style>'
            f'<rect class="rl-bg" width="{WIDTH}" height="{HEIGHT}"/>{"".join(body)}</svg>\n')


def render_roofline(target: Mapping[str, Any] | None) -> str:
    """The chart for one target of a status dict (rooflight.agent.serve.status); a notice when it has no roofs."""
    if target is None:
        return _frame([f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no target</text>'],
                      "Roofline: no target")
    roof = target.get("roofline")
    title = f"Roofline of {target['name']}"
    if not roof:
        return _frame([f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">'
                       f'{_text(target["name"])}: no GPU profile yet</text>'], title)
    points = _points(target)
    scale = _Scale(axis_ranges(roof, points))
    gpu = f"{roof['tensor_parallel_size']} x {roof['gpu_name']} ({roof['compute_dtype']})"
    body = [*_grid(scale), *_roofs(scale, roof), *_plotted(scale, points), _legend(),
            f'<text class="rl-muted" x="{WIDTH - RIGHT - 4}" y="{HEIGHT - BOTTOM - 22}" text-anchor="end">'
            f'{_text(gpu)}</text>']
    if not any(k == "decode" for k, _, _ in points):
        body.append(f'<text class="rl-muted" x="{(LEFT + WIDTH - RIGHT) / 2:.1f}" y="{HEIGHT / 2}" '
                    'text-anchor="middle">no decode point yet: the window is filling, or the engine is idle</text>')
    return _frame(body, f"{title}: {gpu}")
