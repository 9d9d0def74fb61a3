"""What `hstu-replay plan cache-curve` writes and prints: curve.json (the trace, the options, the
requested budgets and the curve's steps), curve.csv (every step: budget tokens, hit ratio) and
curve.svg (`analysis.curve_chart`). With host budgets, also the two-tier grid: curve.json's `tiers`
and curve_tiers.csv.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson

from hstu_replay.output.chart import standalone
from hstu_replay.analysis.cache_curve import CacheCurve
from hstu_replay.analysis.curve_chart import curve_chart
from hstu_replay.analysis.store_curve import CurveOptions
from hstu_replay.analysis.tier_curve import TierCurve

CURVE_JSON, CURVE_CSV, CURVE_SVG, TIERS_CSV = "curve.json", "curve.csv", "curve.svg", "curve_tiers.csv"


def curve_json(curve: CacheCurve, info: dict, options: CurveOptions, budgets: list[int]) -> dict:
    return {
        "computed": "offline, one pass (stack distances) over the store's natural-replay trace",
        "trace": info,
        "options": {"candidates": options.candidates, "max_history": options.limits.max_history,
                    "max_values": options.limits.max_values, "batch_size": options.batch_size,
                    "slice_ms": options.slice_ms, "page_tokens": options.page_tokens,
                    "over_limit": options.policy.over_limit.value, "rebase_keep": options.policy.rebase_keep},
        "requests": curve.requests, "accesses": curve.accesses, "returning": curve.returning,
        "total_tokens": curve.total_tokens, "exact_from_tokens": curve.exact_from_tokens,
        "all_fit_tokens": curve.all_fit_tokens, "max_ratio": curve.max_ratio,
        "budgets": [{"budget_tokens": b, "hit_ratio": curve.ratio(b), "exact": b >= curve.exact_from_tokens or b < curve.page_tokens}
                    for b in budgets],
        "steps": len(curve.points()),
    }


def tiers_json(tiers: TierCurve, gpu_budgets: list[int], host_budgets: list[int]) -> dict:
    """curve.json's `tiers`: the token hit ratio per tier at every (GPU budget, host budget) asked for."""
    return {"computed": "offline, one pass of stack distances per pool (analysis.tier_curve)",
            "offload_mode": tiers.offload_mode, "exact_from_tokens": tiers.exact_from_tokens,
            "grid": tiers.grid(gpu_budgets, host_budgets)}


def tiers_lines(grid: list[dict]) -> list[str]:
    return [f"  gpu {p['gpu_budget_tokens']:>12,} host {p['host_budget_tokens']:>12,} tokens: gpu hit "
            f"{p['gpu_ratio']:.4f} host hit {p['host_ratio']:.4f} together {p['hit_ratio']:.4f}"
            + ("" if p["exact"] else " (below the largest request: approximate)") for p in grid]


def write_curve(out: Path, curve: CacheCurve, summary: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / CURVE_JSON, out / CURVE_CSV]
    if summary.get("tiers"):
        text = io.StringIO()
        rows = csv.writer(text)
        rows.writerow(["gpu_budget_tokens", "host_budget_tokens", "gpu_ratio", "host_ratio", "hit_ratio"])
        rows.writerows((p["gpu_budget_tokens"], p["host_budget_tokens"], f"{p['gpu_ratio']:.6f}",
                        f"{p['host_ratio']:.6f}", f"{p['hit_ratio']:.6f}") for p in summary["tiers"]["grid"])
        (out / TIERS_CSV).write_text(text.getvalue())
        written.append(out / TIERS_CSV)
    written[0].write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    text = io.StringIO()
    rows = csv.writer(text)
    rows.writerow(["budget_tokens", "hit_ratio"])
    rows.writerows((b, f"{r:.6f}") for b, r in curve.points())
    written[1].write_text(text.getvalue())
    (out / CURVE_SVG).write_bytes(standalone(curve_chart(curve, summary)))
    written.append(out / CURVE_SVG)
    return written
