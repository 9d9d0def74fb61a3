"""The report object (what report.json holds), built from a run's merged statistics.

`build_report` is pure apart from the clock (pass `created` to pin it): every writer
(JSON, CSV, charts, HTML) and the CI thresholds read this one object, never RunStats.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

import hstu_replay
from hstu_replay.output.files import jsonable
from hstu_replay.output.text import fmt
from hstu_replay.report.flags import StageRules, stage_flags
from hstu_replay.report.tier_section import SOURCE_MARK, stage_tiers
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats
from hstu_replay.verify import DEFAULT_TOLERANCE


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def _speedup(baseline_ms: float | None, mean_ms: float) -> float:
    if baseline_ms is None or not math.isfinite(baseline_ms) or not mean_ms > 0:
        return math.nan
    return baseline_ms / mean_ms


def ms_per_logical_request(mean_ms: float, batch_size: int) -> float:
    """NVIDIA's "latency per logical request" for a stage: the mean latency of its measured
    requests divided by the users each carries. For one request in flight sent back to back this
    is NVIDIA's end-to-end time / (Triton calls x logical batch size), less the client's own
    time between calls (a latency is a request's time on the wire)."""
    return mean_ms / batch_size if batch_size > 0 else math.nan


def _cpu_ms_per_request(s: BinStats) -> float:
    """Load-generator CPU (every load-generating process, not a Locust master) per measured request
    sent, answered or not; the primes those requests needed are in it too. NaN where unsampled."""
    sent = s.requests + s.errors
    return s.client_cpu_s * 1e3 / sent if sent and s.client_wall_s > 0 else math.nan


def _stage(key: BinKey, s: BinStats, rules: StageRules) -> dict:
    return {
        "name": key.name(),
        "flags": stage_flags(key, s, rules),
        "batch_size": key.batch_size,
        "target_ratio": key.goal_ratio,
        "achieved_ratio": s.achieved_ratio,
        "hit_source": s.hit_source,
        "mean_history_tokens": _ratio(s.history_tokens, s.logical_requests),
        "predicted_ratio": s.predicted_ratio,
        "observed_ratio": s.observed_ratio,
        "expected_ratio": _ratio(s.expected_hits, s.history_tokens),
        "hit_disagreements": s.hit_disagreements,
        "hits_lost": s.hits_lost,
        "tiers": stage_tiers(s, dict(rules.tier_mix) or None),
        "requests": s.requests,
        "mean_ms": s.latency.mean_ms,
        "ms_per_logical_request": ms_per_logical_request(s.latency.mean_ms, key.batch_size),
        "p50_ci_ms": list(s.latency.percentile_interval_ms(50)),
        "p99_ci_ms": list(s.latency.percentile_interval_ms(99)),
        "client_cpu_mean": _ratio(s.client_cpu_s, s.client_wall_s),
        "client_cpu_peak": s.client_cpu_peak,
        "client_cpu_s": s.client_cpu_s,
        "client_cpu_ms_per_request": _cpu_ms_per_request(s),
        "loop_lag_p99_ms": s.loop_lag.percentile_ms(99),
        "loop_lag_max_ms": s.loop_lag.max_us / 1e3 if s.loop_lag.total else math.nan,
        "server_down_s": s.server_down_s,
    }


def _bin(key: BinKey, s: BinStats, baseline_ms: float | None, server: dict | None,
         requested_rps: float | None, rules: StageRules) -> dict:
    h, c, lag = s.latency, s.corrected, s.lag
    duration = s.duration_s
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: math.nan)
    return {
        "name": key.name(),
        "batch_size": key.batch_size,
        "target_ratio": key.goal_ratio,
        "achieved_ratio": s.achieved_ratio,
        "hit_source": s.hit_source,
        "requests": s.requests,
        "logical_requests": s.logical_requests,
        "failures": s.failures,
        "errors": s.errors,
        "error_ratio": _ratio(s.failures, s.requests + s.errors),
        "throughput_rps": s.throughput,
        "logical_throughput": per_s(s.logical_requests),
        # the server's whole work in the window: measured requests plus the primes they needed
        "prime_requests": s.prime_requests,
        "prime_failures": s.prime_failures,
        "primes_per_request": _ratio(s.prime_requests, s.requests),
        "server_requests": s.requests + s.errors + s.prime_requests,
        "server_rps": per_s(s.requests + s.errors + s.prime_requests),
        "computed_tokens": s.computed_tokens,
        "prime_tokens": s.prime_tokens,
        "computed_tokens_per_s": per_s(s.computed_tokens + s.prime_tokens),
        "mean_ms": h.mean_ms,
        "ms_per_logical_request": ms_per_logical_request(h.mean_ms, key.batch_size),
        "p50_ms": h.percentile_ms(50),
        "p90_ms": h.percentile_ms(90),
        "p99_ms": h.percentile_ms(99),
        "p999_ms": h.percentile_ms(99.9),
        "max_ms": h.max_us / 1e3 if h.total else math.nan,
        "speedup": _speedup(baseline_ms, h.mean_ms),
        "requested_rps": requested_rps,
        "corrected_mean_ms": c.mean_ms,
        "corrected_p50_ms": c.percentile_ms(50),
        "corrected_p99_ms": c.percentile_ms(99),
        "lag_p50_ms": lag.percentile_ms(50),
        "lag_p99_ms": lag.percentile_ms(99),
        "lag_max_ms": lag.max_us / 1e3 if lag.total else math.nan,
        "verified": s.verified,
        "mismatches": s.mismatches,
        "server": server,
        "flags": [f["flag"] for f in stage_flags(key, s, rules)],
    }


def build_report(
    stats: RunStats,
    run: dict,
    server: dict[str, dict] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    created: datetime | None = None,
    requested_rps: float | None = None,
    rules: StageRules = StageRules(),
) -> dict:
    """The report of a run; `server` maps bin names to the server's own figures for that bin.

    `requested_rps` is the open-loop target rate (None for closed loop); with it, every bin also
    reports latency from the intended send time (`corrected_*`) and the schedule lag.
    A bin's speed-up is the mean latency of the 0.0-target bin of its batch size over its own
    mean latency (null where that batch size has no 0.0 bin).
    """
    server = server or {}
    items = sorted(stats.bins.items())
    baselines = {k.batch_size: s.latency.mean_ms for k, s in items if k.goal_ratio == 0.0}
    when = (created or datetime.now(timezone.utc)).astimezone(timezone.utc)
    causes = sorted(stats.errors.items(), key=lambda kv: (-kv[1].count, kv[0]))  # most frequent first
    report = {
        "tool": "hstu-replay",
        "version": hstu_replay.__version__,
        "created": when.isoformat(timespec="seconds"),
        "run": run,
        "stages": [_stage(k, s, rules) for k, s in items],
        "bins": [_bin(k, s, baselines.get(k.batch_size), server.get(k.name()), requested_rps, rules)
                 for k, s in items],
        "verification": {
            "verified": sum(s.verified for _, s in items),
            "mismatches": sum(s.mismatches for _, s in items),
            "tolerance": tolerance,
        },
        "primes": {"requests": sum(s.prime_requests for _, s in items),
                   "failures": sum(s.prime_failures for _, s in items)},
        "warmup_requests": stats.warmup_requests,
        "errors": {cause: counted.count for cause, counted in causes},
        "error_examples": {cause: counted.example for cause, counted in causes},
        "thresholds": None,
    }
    return jsonable(report)


# -- the terminal table --------------------------------------------------------------------

def flagged_stages(report: dict) -> list[dict]:
    """Stages whose figures are not solid (see report.flags)."""
    return [s for s in report["stages"] if s["flags"]]


#: How each hit-ratio source reads in tables.

TABLE_HEADER = ["batch", "target", "achieved", "from", "requests", "errors", "mismatches", "primes", "req/s",
                "server req/s", "mean ms", "ms/logical", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "speed-up", "flags"]


def goal_name(ratio: float | None) -> str:
    """A stage's target ratio as shown; a natural replay's (NaN, null in JSON) has none."""
    return "natural" if ratio is None or math.isnan(ratio) else f"{ratio:g}"


def latency_table(report: dict) -> list[list[str]]:
    """Header plus one row per bin: latency against hit ratio, as strings."""
    rows = [list(TABLE_HEADER)]
    for b in report["bins"]:
        rows.append([
            str(b["batch_size"]),
            goal_name(b["target_ratio"]),
            fmt(b["achieved_ratio"], ".3f"),
            SOURCE_MARK[b["hit_source"]],
            str(b["requests"]),
            str(b["errors"]),
            str(b["mismatches"]),
            str(b["prime_requests"]),
            fmt(b["throughput_rps"], ".1f"),
            fmt(b["server_rps"], ".1f"),
            fmt(b["mean_ms"], ".2f"),
            fmt(b["ms_per_logical_request"], ".3f"),
            *(fmt(b[k], ".2f") for k in ("p50_ms", "p90_ms", "p99_ms", "p999_ms")),
            fmt(b["speedup"], ".2f", "x"),
            ",".join(b["flags"]) or "ok",
        ])
    return rows
