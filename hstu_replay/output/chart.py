"""Charts as inline SVG: lines of several series against two axes (linear or logarithmic), with
a title, axis labels, a legend, reference lines and marked points.

Plain strings, no dependency: pages embed them and the same text is a standalone .svg file. Every
point carries its exact value (`data-*` attributes, a tooltip), so what a chart shows can be
checked against the JSON it was drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hstu_replay.output.page import escape

WIDTH, HEIGHT = 560, 320  # the width grows where the legend's labels need more
LEGEND_CHAR_PX = 6.5  # room a legend character takes at font-size 11
LEFT, RIGHT, TOP, BOTTOM = 64, 440, 36, 272  # the plot area, in pixels
INSET = 8  # an axis's first and last values sit this far inside the plot area, where asked
MARK_COLOR = "#d62728"  # rings round flagged points, the cross of a breached one, a limit line
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
DASHED, DOTTED = "6 4", "2 3"  # stroke-dasharray of a second and a third statistic
LABELLED_DECADES = 3  # a log axis of more decades ticks at powers of ten alone


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """0 and up, by the smallest step of 1, 2, 2.5 or 5 x 10^k that reaches `top` in at most
    `most` steps (top <= 0: 0 and 1)."""
    if not top > 0:
        return [0.0, 1.0]
    magnitude = 10.0 ** math.floor(math.log10(top / most))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if math.ceil(top / (m * magnitude) - 1e-9) <= most)
    count = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def log_ticks(low: float, high: float) -> list[float]:
    """Powers of ten from the one at or below `low` to the one at or above `high` (both > 0), with
    2 and 5 times each between them where that spans at most LABELLED_DECADES decades."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    last = max(last, first + 1)
    steps = (1, 2, 5) if last - first <= LABELLED_DECADES else (1,)
    ticks = [m * 10.0 ** k for k in range(first, last) for m in steps] + [10.0 ** last]
    return [float(f"{t:.12g}") for t in ticks]


def tick_label(value: float) -> str:
    return f"{value:g}"


def _num(value: float) -> str:
    return f"{value:.1f}"


@dataclass(frozen=True)
class Axis:
    """One axis: its label, the values at its two ends, where its ticks go and how they read."""

    label: str
    low: float
    high: float
    ticks: Sequence[float]
    log: bool = False  # logarithmic (every value > 0)
    inset: float = 0.0  # pixels between the plot area's edge and `low` / `high`
    tick_text: Callable[[float], str] = tick_label

    def _at(self, value: float) -> float:
        return math.log(value) if self.log else value

    def scale(self, start: float, end: float) -> Callable[[float], float]:
        """The map of [low, high] onto [start, end] pixels, `inset` inside."""
        direction = 1 if end >= start else -1
        start, end = start + direction * self.inset, end - direction * self.inset
        low, high = self._at(self.low), self._at(self.high)
        span = high - low or 1.0
        return lambda value: start + (self._at(value) - low) / span * (end - start)

    def holds(self, value: float) -> bool:
        return value is not None and math.isfinite(value) and (value > 0 or not self.log)


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    tip: str  # the tooltip
    data: Mapping[str, str] = field(default_factory=dict)  # data-* attributes (names without "data-")
    ringed: bool = False  # a red ring around it (its figures are not solid)
    crossed: bool = False  # a cross over it (it broke a limit)


@dataclass(frozen=True)
class Series:
    color: str
    points: Sequence[Point]
    data: Mapping[str, str] = field(default_factory=dict)  # data-* attributes of its line
    dash: str = ""  # stroke-dasharray; "" is a solid line
    hollow: bool = False  # points drawn as rings
    line: bool = True  # a line through the points
    dots: bool = True  # a dot at each point
    steps: bool = False  # the line steps: flat to the next point's x, then up or down


@dataclass(frozen=True)
class Key:
    """One legend entry: a swatch (wide line), a line of a style, a ring or a cross."""

    label: str
    color: str = "currentColor"
    dash: str = ""
    width: float = 2
    ring: bool = False
    cross: bool = False


@dataclass(frozen=True)
class Reference:
    """A horizontal line across the plot at `y`."""

    y: float
    color: str = "grey"
    dash: str = ""


def _data(data: Mapping[str, str]) -> str:
    return "".join(f' data-{name}="{escape(value)}"' for name, value in data.items())


def _axes(x: Axis, y: Axis, x_px: Callable, y_px: Callable) -> list[str]:
    parts = ['<g class="axes" fill="currentColor" font-size="11">']
    for tick in y.ticks:
        at = _num(y_px(tick))
        parts.append(f'<line x1="{LEFT}" x2="{RIGHT}" y1="{at}" y2="{at}" stroke="currentColor" stroke-opacity="0.15"/>'
                     f'<text x="{LEFT - 6}" y="{at}" text-anchor="end" dominant-baseline="middle">'
                     f"{escape(y.tick_text(tick))}</text>")
    for tick in x.ticks:
        at = _num(x_px(tick))
        parts.append(f'<line x1="{at}" x2="{at}" y1="{TOP}" y2="{BOTTOM}" stroke="currentColor" stroke-opacity="0.15"/>'
                     f'<text x="{at}" y="{BOTTOM + 16}" text-anchor="middle">{escape(x.tick_text(tick))}</text>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" '
                 'stroke="currentColor" stroke-opacity="0.5"/>')
    parts.append(f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{escape(x.label)}</text>')
    middle = (TOP + BOTTOM) / 2
    parts.append(f'<text x="14" y="{middle:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {middle:.1f})">{escape(y.label)}</text>')
    parts.append("</g>")
    return parts


def _cross(x: str, y: str, color: str) -> str:
    cx, cy, r = float(x), float(y), 5
    return (f'<path class="cross" d="M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}'
            f'M{cx - r:.1f},{cy + r:.1f}L{cx + r:.1f},{cy - r:.1f}" stroke="{color}" stroke-width="2.5"/>')


def _series(series: Series, x: Axis, y: Axis, x_px: Callable, y_px: Callable) -> list[str]:
    points = [p for p in series.points if x.holds(p.x) and y.holds(p.y)]
    coords = [(_num(x_px(p.x)), _num(y_px(p.y))) for p in points]
    parts = []
    if series.line:
        path = coords
        if series.steps:
            path = [c for (x0, y0), (x1, _) in zip(coords, coords[1:]) for c in ((x0, y0), (x1, y0))] + coords[-1:]
        dash = f' stroke-dasharray="{series.dash}"' if series.dash else ""
        parts.append(f'<polyline class="line"{_data(series.data)} fill="none" stroke="{series.color}" '
                     f'stroke-width="2"{dash} points="{" ".join(f"{a},{b}" for a, b in path)}"/>')
    fill = 'fill="white"' if series.hollow else f'fill="{series.color}"'
    for p, (cx, cy) in zip(points, coords):
        if p.ringed:
            parts.append(f'<circle class="flag-ring" cx="{cx}" cy="{cy}" r="8" fill="none" stroke="{MARK_COLOR}" '
                         'stroke-width="1.5"/>')
        if series.dots:
            parts.append(f'<circle class="point"{_data(p.data)} cx="{cx}" cy="{cy}" r="4" '
                         f'{fill} stroke="{series.color}" stroke-width="1.5"><title>{escape(p.tip)}</title></circle>')
        if p.crossed:
            parts.append(_cross(cx, cy, series.color))
    return parts


def _legend(groups: Sequence[Sequence[Key]]) -> list[str]:
    parts = ['<g class="legend" font-size="11" fill="currentColor">']
    y = TOP + 6
    for number, group in enumerate(g for g in groups if g):
        y += 6 if number else 0
        for key in group:
            if key.ring:
                parts.append(f'<circle cx="{RIGHT + 26}" cy="{y}" r="7" fill="none" stroke="{key.color}" '
                             'stroke-width="1.5"/>')
            elif key.cross:
                parts.append(_cross(str(RIGHT + 26), str(y), key.color))
            else:
                dash = f' stroke-dasharray="{key.dash}"' if key.dash else ""
                parts.append(f'<line x1="{RIGHT + 14}" x2="{RIGHT + 38}" y1="{y}" y2="{y}" stroke="{key.color}" '
                             f'stroke-width="{key.width:g}"{dash}/>')
            parts.append(f'<text x="{RIGHT + 44}" y="{y}" dominant-baseline="middle">{escape(key.label)}</text>')
            y += 18
    parts.append("</g>")
    return parts


def chart(name: str, title: str, x: Axis, y: Axis, series: Sequence[Series], legend: Sequence[Sequence[Key]],
          references: Sequence[Reference] = (), empty: str = "no data") -> str:
    """One chart; `empty` is written across the plot where no series has a point to draw (then
    neither references nor a legend are drawn)."""
    x_px, y_px = x.scale(LEFT, RIGHT), y.scale(BOTTOM, TOP)
    drawn = any(x.holds(p.x) and y.holds(p.y) for s in series for p in s.points)
    longest = max((len(key.label) for group in legend for key in group), default=0) if drawn else 0
    width = max(WIDTH, math.ceil(RIGHT + 44 + longest * LEGEND_CHAR_PX + 8))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="hstu-chart" data-chart="{escape(name)}" '
             f'viewBox="0 0 {width} {HEIGHT}" width="{width}" height="{HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" font-family="system-ui, sans-serif">',
             f"<title>{escape(title)}</title>",
             f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="20" text-anchor="middle" font-size="13" font-weight="bold" '
             f'fill="currentColor">{escape(title)}</text>']
    parts += _axes(x, y, x_px, y_px)
    if drawn:
        for ref in references:
            at = _num(y_px(ref.y))
            dash = f' stroke-dasharray="{ref.dash}"' if ref.dash else ""
            parts.append(f'<line class="reference" x1="{LEFT}" x2="{RIGHT}" y1="{at}" y2="{at}" stroke="{ref.color}" '
                         f'stroke-width="1"{dash}/>')
        for s in series:
            parts += _series(s, x, y, x_px, y_px)
        parts += _legend(legend)
    else:
        parts.append(f'<text x="{(LEFT + RIGHT) / 2:.1f}" y="{(TOP + BOTTOM) / 2:.1f}" text-anchor="middle" '
                     f'fill="currentColor">{escape(empty)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def standalone(svg: str) -> bytes:
    """A chart as the bytes of an .svg file, on white (a page gives it its own background)."""
    head = svg.index(">") + 1
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + svg[:head] + '<rect class="background" width="100%" '
            'height="100%" fill="white"/>' + svg[head:] + "\n").encode()
