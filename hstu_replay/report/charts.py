"""A run's charts against the achieved hit ratio, one series per batch size: latency (p50, p99),
speed-up and throughput.

The HTML report embeds the first two, the web UI's tab shows them live, and the report writes
all three as .svg files beside report.json. A point carries its stage and exact value; a point of
a flagged stage is ringed in red and names its flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay.output.chart import (
    COLORS, DASHED, DOTTED, INSET, MARK_COLOR, Axis, Key, Reference, Series, chart, nice_ticks,
)
from hstu_replay.output.chart import Point as Mark

LATENCY_SVG = "latency_vs_hit_ratio.svg"
SPEEDUP_SVG = "speedup_vs_hit_ratio.svg"
THROUGHPUT_SVG = "throughput_vs_hit_ratio.svg"
CHART_NAMES = (LATENCY_SVG, SPEEDUP_SVG, THROUGHPUT_SVG)  # the files written beside report.json
RATIO_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)
EMPTY = "no measured stage yet"


@dataclass(frozen=True)
class Point:
    stage: str
    x: float  # achieved hit ratio
    y: float
    flags: tuple[str, ...] = ()  # the stage's flags (report.flags): its figures are not solid


@dataclass(frozen=True)
class Line:
    batch: int
    metric: str  # the report key drawn
    label: str  # how a tooltip and the legend name it
    points: list[Point]
    dash: str = ""
    hollow: bool = False


def series(report: dict, key: str) -> dict[int, list[Point]]:
    """batch size -> its bins' (achieved ratio, `key`) points by ratio; bins lacking either left out."""
    points: dict[int, list[Point]] = {}
    for b in report["bins"]:
        x, y = b["achieved_ratio"], b[key]
        if x is not None and y is not None:
            points.setdefault(b["batch_size"], []).append(Point(b["name"], x, y, tuple(b.get("flags") or ())))
    return {batch: sorted(p, key=lambda q: (q.x, q.stage)) for batch, p in sorted(points.items())}


def _mark(line: Line, p: Point) -> Mark:
    tip = f"{p.stage}: batch {line.batch}, achieved hit ratio {p.x:.3f}, {line.label} {p.y:.2f}"
    if p.flags:
        tip += f" (flagged: {', '.join(p.flags)})"
    data = {"stage": p.stage, "batch": str(line.batch), "metric": line.metric, "x": repr(p.x), "y": repr(p.y),
            "flags": ",".join(p.flags)}
    return Mark(p.x, p.y, tip, data, ringed=bool(p.flags))


def _legend(batches: list[int], lines: list[Line]) -> list[list[Key]]:
    """Colour names the batch size; line style (when there are several) the statistic; a red
    ring a flagged stage."""
    styles = list(dict.fromkeys((line.label, line.dash) for line in lines))
    return [[Key(f"batch {batch}", COLORS[i % len(COLORS)], width=6) for i, batch in enumerate(batches)],
            [Key(label, dash=dash) for label, dash in styles] if len(styles) > 1 else [],
            [Key("flagged stage", MARK_COLOR, ring=True)] if any(p.flags for ln in lines for p in ln.points) else []]


def ratio_chart(name: str, title: str, y_label: str, lines: list[Line], reference: float | None = None) -> str:
    """One chart: the lines against the achieved hit ratio (0..1), the y axis from 0; a grey
    horizontal line at `reference` where given."""
    values = [p.y for line in lines for p in line.points]
    ticks = nice_ticks(max(values + ([reference] if reference is not None else []), default=0.0))
    batches = sorted({line.batch for line in lines})
    drawn = [Series(COLORS[batches.index(ln.batch) % len(COLORS)], [_mark(ln, p) for p in ln.points],
                    {"batch": str(ln.batch), "metric": ln.metric}, dash=ln.dash, hollow=ln.hollow) for ln in lines]
    return chart(name, title, Axis("achieved hit ratio", 0.0, 1.0, RATIO_TICKS, inset=INSET),
                 Axis(y_label, 0.0, ticks[-1], ticks), drawn, _legend(batches, lines),
                 [Reference(reference)] if reference is not None else [], empty=EMPTY)


#: The latency chart's statistics: report key, label, line style, hollow points.
LATENCY_STATISTICS = {"p50_ms": ("p50 ms", "", False), "p99_ms": ("p99 ms", DASHED, True),
                      "mean_ms": ("mean ms", DOTTED, False)}


def latency_chart(report: dict, keys: tuple[str, ...] = ("p50_ms", "p99_ms")) -> str:
    """p50 (solid) and p99 (dashed, hollow points) latency per batch size; the mean (dotted) too
    where `keys` has it."""
    by_key = {key: series(report, key) for key in keys}
    lines = [Line(batch, key, label, by_key[key].get(batch, []), dash, hollow)
             for batch in sorted(set().union(*by_key.values())) for key in keys
             for label, dash, hollow in [LATENCY_STATISTICS[key]]]
    return ratio_chart("latency", "Latency vs achieved hit ratio", "latency (ms)", [ln for ln in lines if ln.points])


def speedup_chart(report: dict) -> str:
    """Speed-up over the 0% stage of the same batch size (mean latency), with 1x marked."""
    lines = [Line(batch, "speedup", "speed-up", points) for batch, points in series(report, "speedup").items()]
    return ratio_chart("speedup", "Speed-up over no cache reuse", "speed-up (x)", lines, reference=1.0)


def throughput_chart(report: dict) -> str:
    """Requests per second carried per batch size."""
    lines = [Line(batch, "throughput_rps", "req/s", points)
             for batch, points in series(report, "throughput_rps").items()]
    return ratio_chart("throughput", "Throughput vs achieved hit ratio", "requests / s", lines)


def charts(report: dict) -> list[str]:
    """The charts of the report page and the web tab, in the order shown."""
    return [latency_chart(report), speedup_chart(report)]


def chart_files(report: dict) -> dict[str, str]:
    """File name -> SVG of every chart written beside report.json (the latency one with the mean)."""
    return {LATENCY_SVG: latency_chart(report, ("p50_ms", "p99_ms", "mean_ms")), SPEEDUP_SVG: speedup_chart(report),
            THROUGHPUT_SVG: throughput_chart(report)}
