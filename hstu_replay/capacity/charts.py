"""A capacity result's two charts against the load, one series per hit ratio (and pools): the
throughput carried (beside what was offered, for an offered rate) and the p99 latency (on a
log scale, the SLO marked). A step that broke the SLO is crossed.
"""

from __future__ import annotations

from hstu_replay.capacity.tables import series_label
from hstu_replay.output.chart import (
    COLORS, DASHED, INSET, MARK_COLOR, Axis, Key, Point, Reference, Series, chart, log_ticks, nice_ticks,
)

THROUGHPUT_SVG = "capacity_throughput.svg"
P99_SVG = "capacity_p99.svg"
LOG_LOADS_FROM = 8  # loads spanning this factor or more lie on a log axis


def _load_axis(data: dict) -> Axis:
    """The load steps as ticks; on a log axis where they span LOG_LOADS_FROM or more."""
    loads = [x for x in data["load"]["steps"] if x > 0] or [1.0]
    log = max(loads) / min(loads) >= LOG_LOADS_FROM
    low = min(loads) if log else 0.0
    return Axis(f"load ({data['load']['unit']})", low, max(loads), loads, log=log, inset=INSET)


def _series(data: dict, key: str, unit: str) -> list[Series]:
    """Per hit ratio (and pools): every step with a value, crossed where it broke the SLO."""
    drawn = []
    for i, ratio in enumerate(data["ratios"]):
        label = series_label(ratio)
        points = [Point(s["load"], s[key], f"{label}, load {s['load']:g}: {s[key]:.2f} {unit}"
                        + ("" if s["passed"] else f" (breach: {'; '.join(s['breaches'])})"),
                        {"load": repr(s["load"]), "value": repr(s[key]), "passed": str(s["passed"]).lower()},
                        crossed=not s["passed"])
                  for s in ratio["steps"] if s[key] is not None]
        drawn.append(Series(COLORS[i % len(COLORS)], points, {"ratio": label, "metric": key}))
    return drawn


def _legend(series: list[Series], more: list[Key]) -> list[list[Key]]:
    keys = [Key(s.data["ratio"], s.color, width=6) for s in series if s.points]
    breached = any(p.crossed for s in series for p in s.points)
    return [keys, more, [Key("SLO breached", MARK_COLOR, cross=True)] if breached else []]


def throughput_chart(data: dict) -> str:
    """Requests per second carried per step; for an offered rate, the offered rate as a grey dashed line."""
    measured = _series(data, "throughput_rps", "req/s")
    offered, more = [], []
    if data["load"]["kind"] == "rate" and any(s.points for s in measured):  # to compare with what was carried
        steps = [x for x in data["load"]["steps"] if x > 0]
        offered = [Series("grey", [Point(x, x, f"offered {x:g} req/s") for x in steps], {"metric": "offered"},
                          dash=DASHED, dots=False)]
        more = [Key("offered", "grey", DASHED)]
    ticks = nice_ticks(max((p.y for s in measured + offered for p in s.points), default=0.0))
    return chart("throughput", "Throughput vs load (X: SLO breached)", _load_axis(data),
                 Axis("requests / s", 0.0, ticks[-1], ticks), measured + offered, _legend(measured, more))


def p99_chart(data: dict) -> str:
    """p99 latency per step on a log axis (latency past the knee grows by orders of magnitude),
    the SLO as a red dashed line."""
    slo = data["slo"]["p99_ms"]
    series = _series(data, "p99_ms", "ms")
    values = [p.y for s in series for p in s.points if p.y > 0] + [slo]
    ticks = log_ticks(min(values), max(values))
    return chart("p99", "p99 latency vs load (X: SLO breached)", _load_axis(data),
                 Axis("p99 latency (ms)", ticks[0], ticks[-1], ticks, log=True), series,
                 _legend(series, [Key(f"SLO p99 {slo:g} ms", MARK_COLOR, DASHED)]),
                 [Reference(slo, MARK_COLOR, DASHED)])


def chart_files(data: dict) -> dict[str, str]:
    """File name -> SVG of each chart, in the order capacity.html shows them."""
    return {THROUGHPUT_SVG: throughput_chart(data), P99_SVG: p99_chart(data)}
