"""curve.svg: a store's token hit ratio against the KV-cache budget, the budgets asked for marked."""

from __future__ import annotations

from hstu_replay.output.chart import COLORS, MARK_COLOR, Axis, Key, Point, Series, chart, nice_ticks
from hstu_replay.analysis.cache_curve import CacheCurve

MILLION = 1e6  # the x axis counts millions of tokens


def curve_chart(curve: CacheCurve, summary: dict) -> str:
    """The curve as it steps (flat until the next budget that changes the ratio), on to 5% past the
    budget where every return hits, or to the largest budget asked for; a red dot at each budget of
    curve.json's `budgets`."""
    end = max([max(curve.all_fit_tokens, 1) * 1.05] + [b["budget_tokens"] for b in summary["budgets"]])
    points = curve.points() + [(end, curve.max_ratio)]
    line = [Point(b / MILLION, r, f"{b:,.0f} tokens: hit ratio {r:.4f}") for b, r in points]
    asked = [Point(b["budget_tokens"] / MILLION, b["hit_ratio"],
                   f"budget {b['budget_tokens']:,} tokens: hit ratio {b['hit_ratio']:.4f}",
                   {"budget": str(b["budget_tokens"]), "ratio": repr(b["hit_ratio"])})
             for b in summary["budgets"]]
    x_ticks = nice_ticks(max(p.x for p in line + asked))
    y_ticks = nice_ticks(max(p.y for p in line + asked))
    series = [Series(COLORS[0], line, {"metric": "hit_ratio"}, dots=False, steps=True),
              Series(MARK_COLOR, asked, {"metric": "budgets"}, line=False)]
    legend = [[Key("token hit ratio", COLORS[0])], [Key("budgets asked", MARK_COLOR, width=6)] if asked else []]
    return chart("curve", f"LRU of whole users, pages of {curve.page_tokens}: {summary['trace']['visits']:,} visits",
                 Axis("KV-cache budget (million tokens)", 0.0, x_ticks[-1], x_ticks),
                 Axis("token hit ratio", 0.0, y_ticks[-1], y_ticks), series, legend)
