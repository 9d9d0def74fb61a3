"""Charts of a report as inline SVG: latency (p50, p99) and speed-up against the achieved hit
ratio, one series per batch size.

Plain strings from the report object, no dependency: the HTML report embeds them and the web
UI's tab shows them live. Every point carries its stage and exact value (`data-*` attributes,
a tooltip), so what a chart shows can be checked against report.json; a point of a flagged stage
is ringed in red and names its flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hstu_replay.report.kit import escape

WIDTH, HEIGHT = 560, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 440, 36, 272  # the plot area, in pixels
INSET = 8  # hit ratios 0 and 1 sit this far inside the plot area
FLAG_COLOR = "#d62728"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


@dataclass(frozen=True)
class Point:
    stage: str
    x: float  # achieved hit ratio
    y: float
    flags: tuple[str, ...] = ()  # the stage's flags (report.flags): its figures are not solid


@dataclass(frozen=True)
class Scale:
    """The linear map of [lo, hi] onto [start, end] pixels."""

    lo: float
    hi: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        return self.start + (value - self.lo) / (self.hi - self.lo) * (self.end - self.start)


X_SCALE = Scale(0.0, 1.0, LEFT + INSET, RIGHT - INSET)


def series(report: dict, key: str) -> dict[int, list[Point]]:
    """batch size -> its bins' (achieved ratio, `key`) points by ratio; bins lacking either left out."""
    points: dict[int, list[Point]] = {}
    for b in report["bins"]:
        x, y = b["achieved_ratio"], b[key]
        if x is not None and y is not None:
            points.setdefault(b["batch_size"], []).append(Point(b["name"], x, y, tuple(b.get("flags") or ())))
    return {batch: sorted(p, key=lambda q: (q.x, q.stage)) for batch, p in sorted(points.items())}


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """0 and up, by the smallest step of 1, 2, 2.5 or 5 x 10^k that reaches `top` in at most
    `most` steps (top <= 0: 0 and 1)."""
    if not top > 0:
        return [0.0, 1.0]
    magnitude = 10.0 ** math.floor(math.log10(top / most))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if math.ceil(top / (m * magnitude) - 1e-9) <= most)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def _num(value: float) -> str:
    return f"{value:.1f}"


def _tick_label(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Line:
    batch: int
    metric: str  # the report key drawn
    label: str  # how a tooltip names it
    points: list[Point]
    dashed: bool = False
    hollow: bool = False


def _axes(y_scale: Scale, ticks: list[float], y_label: str) -> list[str]:
    parts = ['<g class="axes" fill="currentColor" font-size="11">']
    for tick in ticks:
        y = _num(y_scale(tick))
        parts.append(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{y}" y2="{y}" stroke="currentColor" stroke-opacity="0.15"/>'
                     f'<text x="{LEFT - 6}" y="{y}" text-anchor="end" dominant-baseline="middle">'
                     f"{_tick_label(tick)}</text>")
    for ratio in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = _num(X_SCALE(ratio))
        parts.append(f'<line x1="{x}" x2="{x}" y1="{TOP}" y2="{BOTTOM}" stroke="currentColor" stroke-opacity="0.15"/>'
                     f'<text x="{x}" y="{BOTTOM + 16}" text-anchor="middle">{_tick_label(ratio)}</text>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" '
                 'stroke="currentColor" stroke-opacity="0.5"/>')
    parts.append(f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">achieved hit ratio</text>')
    middle = (TOP + BOTTOM) / 2
    parts.append(f'<text x="14" y="{middle:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {middle:.1f})">{escape(y_label)}</text>')
    parts.append("</g>")
    return parts


def _line(line: Line, y_scale: Scale, color: str) -> list[str]:
    coords = [(_num(X_SCALE(p.x)), _num(y_scale(p.y))) for p in line.points]
    dash = ' stroke-dasharray="6 4"' if line.dashed else ""
    parts = [f'<polyline class="line" data-batch="{line.batch}" data-metric="{escape(line.metric)}" fill="none" '
             f'stroke="{color}" stroke-width="2"{dash} points="{" ".join(f"{x},{y}" for x, y in coords)}"/>']
    fill = 'fill="white"' if line.hollow else f'fill="{color}"'
    for p, (x, y) in zip(line.points, coords):
        tip = f"{p.stage}: batch {line.batch}, achieved hit ratio {p.x:.3f}, {line.label} {p.y:.2f}"
        if p.flags:
            tip += f" (flagged: {', '.join(p.flags)})"
            parts.append(f'<circle class="flag-ring" cx="{x}" cy="{y}" r="8" fill="none" stroke="{FLAG_COLOR}" '
                         'stroke-width="1.5"/>')
        parts.append(f'<circle class="point" data-stage="{escape(p.stage)}" data-batch="{line.batch}" '
                     f'data-metric="{escape(line.metric)}" data-x="{p.x!r}" data-y="{p.y!r}" '
                     f'data-flags="{escape(",".join(p.flags))}" cx="{x}" cy="{y}" r="4" '
                     f'{fill} stroke="{color}" stroke-width="1.5"><title>{escape(tip)}</title></circle>')
    return parts


def _legend(batches: list[int], styles: list[tuple[str, bool]], flagged: bool) -> list[str]:
    """Colour names the batch size; line style (when there are several) the statistic; a red
    ring a flagged stage."""
    parts = ['<g class="legend" font-size="11" fill="currentColor">']
    y = TOP + 6
    for i, batch in enumerate(batches):
        color = COLORS[i % len(COLORS)]
        parts.append(f'<line x1="{RIGHT + 14}" x2="{RIGHT + 38}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="6"/>'
                     f'<text x="{RIGHT + 44}" y="{y}" dominant-baseline="middle">batch {batch}</text>')
        y += 18
    if len(styles) > 1:
        y += 6
        for label, dashed in styles:
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            parts.append(f'<line x1="{RIGHT + 14}" x2="{RIGHT + 38}" y1="{y}" y2="{y}" stroke="currentColor" '
                         f'stroke-width="2"{dash}/><text x="{RIGHT + 44}" y="{y}" dominant-baseline="middle">'
                         f"{escape(label)}</text>")
            y += 18
    if flagged:
        y += 6
        parts.append(f'<circle cx="{RIGHT + 26}" cy="{y}" r="7" fill="none" stroke="{FLAG_COLOR}" stroke-width="1.5"/>'
                     f'<text x="{RIGHT + 44}" y="{y}" dominant-baseline="middle">flagged stage</text>')
    parts.append("</g>")
    return parts


def chart(name: str, title: str, y_label: str, lines: list[Line], reference: float | None = None) -> str:
    """One chart: the lines against the achieved hit ratio (0..1), the y axis from 0; a grey
    horizontal line at `reference` where given."""
    values = [p.y for line in lines for p in line.points]
    ticks = nice_ticks(max(values + ([reference] if reference is not None else []), default=0.0))
    y_scale = Scale(0.0, ticks[-1], BOTTOM, TOP)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="hstu-chart" data-chart="{escape(name)}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" font-family="system-ui, sans-serif">',
             f"<title>{escape(title)}</title>",
             f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="20" text-anchor="middle" font-size="13" font-weight="bold" '
             f'fill="currentColor">{escape(title)}</text>']
    parts += _axes(y_scale, ticks, y_label)
    if reference is not None and values:
        y = _num(y_scale(reference))
        parts.append(f'<line class="reference" x1="{LEFT}" x2="{RIGHT}" y1="{y}" y2="{y}" stroke="grey" '
                     'stroke-width="1"/>')
    batches = sorted({line.batch for line in lines})
    for line in lines:
        parts += _line(line, y_scale, COLORS[batches.index(line.batch) % len(COLORS)])
    if values:
        styles = list(dict.fromkeys((line.label, line.dashed) for line in lines))
        parts += _legend(batches, styles, any(p.flags for line in lines for p in line.points))
    else:
        parts.append(f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="{(TOP + BOTTOM) / 2:.1f}" text-anchor="middle" '
                     'fill="currentColor">no measured stage yet</text>')
    parts.append("</svg>")
    return "".join(parts)


def latency_chart(report: dict) -> str:
    """p50 (solid) and p99 (dashed, hollow points) latency per batch size."""
    p50, p99 = series(report, "p50_ms"), series(report, "p99_ms")
    lines = []
    for batch in sorted(set(p50) | set(p99)):
        lines.append(Line(batch, "p50_ms", "p50 ms", p50.get(batch, [])))
        lines.append(Line(batch, "p99_ms", "p99 ms", p99.get(batch, []), dashed=True, hollow=True))
    return chart("latency", "Latency vs achieved hit ratio", "latency (ms)", [ln for ln in lines if ln.points])


def speedup_chart(report: dict) -> str:
    """Speed-up over the 0% stage of the same batch size (mean latency), with 1x marked."""
    lines = [Line(batch, "speedup", "speed-up", points) for batch, points in series(report, "speedup").items()]
    return chart("speedup", "Speed-up over no cache reuse", "speed-up (x)", lines, reference=1.0)


def charts(report: dict) -> list[str]:
    """Every chart of the report, in the order shown."""
    return [latency_chart(report), speedup_chart(report)]
