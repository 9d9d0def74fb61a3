"""`hstu-replay plan cache-curve`: the trace of a store, its hit-ratio-vs-budget curve, written out.

curve.json (the trace, the options, the requested budgets and the curve's steps), curve.csv
(every step: budget tokens, hit ratio) and curve.png (when matplotlib is installed). With host
budgets, also the two-tier grid (`plan.tier_curve`): curve.json's `tiers` and curve_tiers.csv.
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.plan.cache_curve import CacheCurve, cache_curve
from hstu_replay.plan.over_limit import HistoryPolicy
from hstu_replay.plan.tier_curve import TierCurve, tier_curve
from hstu_replay.plan.timeline import build_trace, group_requests

CURVE_JSON, CURVE_CSV, CURVE_PNG, TIERS_CSV = "curve.json", "curve.csv", "curve.png", "curve_tiers.csv"


@dataclass(frozen=True)
class CurveOptions:
    store: str
    candidates: int = 16
    limits: Limits = Limits()
    batch_size: int = 1
    slice_ms: int = 0
    page_tokens: int = DEFAULT_PAGE_TOKENS
    policy: HistoryPolicy = HistoryPolicy()
    offload_chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS  # the host tier's, under native offload


def store_curve(options: CurveOptions) -> tuple[CacheCurve, dict]:
    """The curve of a store's natural replay; and what was computed (trace size, seconds)."""
    curve, _, info = store_curves(options)
    return curve, info


def store_curves(options: CurveOptions, offload_mode: str | None = None) -> tuple[CacheCurve, TierCurve | None, dict]:
    """The one-tier curve of a store's natural replay and, with an offload mode, its two-tier curve."""
    from hstu_replay.data.store import open_store

    store = open_store(options.store)
    if options.limits.history_cap(options.batch_size, options.candidates) < 1:
        raise ConfigError(f"--max-values {options.limits.max_values}: no room for any history at batch "
                          f"{options.batch_size} with --candidates {options.candidates}")
    began = time.perf_counter()
    trace = build_trace(store, options.candidates, options.limits, options.batch_size, options.policy)
    if not len(trace):
        raise ConfigError(f"--store {options.store}: no user comes back after a gap of 60 s; nothing to replay")
    bounds = group_requests(trace, options.slice_ms, options.batch_size)
    curve = cache_curve(trace.cache_keys, trace.tokens, bounds, options.page_tokens)
    tiers = (tier_curve(trace.cache_keys, trace.tokens, bounds, options.page_tokens, offload_mode,
                        options.offload_chunk_tokens)
             if offload_mode else None)
    seconds = time.perf_counter() - began
    info = {"store": str(options.store), "users": int(len(set(trace.users.tolist()))), "visits": len(trace),
            "history_cap": trace.history_cap, "span_ms": int(trace.times_ms[-1] - trace.times_ms[0]),
            "seconds": round(seconds, 3), "visit_kinds": trace.accounts().to_dict(options.policy)}
    return curve, tiers, info


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
    return {"computed": "offline, one pass of stack distances per pool (plan.tier_curve)",
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
    png = _plot(curve, summary)
    if png is not None:
        (out / CURVE_PNG).write_bytes(png)
        written.append(out / CURVE_PNG)
    return written


def _plot(curve: CacheCurve, summary: dict) -> bytes | None:
    from hstu_replay.report import kit, plots

    if not plots.available():
        return None
    fig = kit.figure()
    ax = fig.add_subplot()
    points = curve.points() + [(max(curve.all_fit_tokens, 1) * 1.05, curve.max_ratio)]
    ax.step([b / 1e6 for b, _ in points], [r for _, r in points], where="post")
    for b in summary["budgets"]:
        ax.plot([b["budget_tokens"] / 1e6], [b["hit_ratio"]], "o")
    ax.set_xlabel("KV-cache budget (million tokens)")
    ax.set_ylabel("token hit ratio")
    ax.set_title(f"LRU of whole users, pages of {curve.page_tokens}: {summary['trace']['visits']:,} visits")
    ax.grid(True, alpha=0.3)
    return kit.png(fig)
