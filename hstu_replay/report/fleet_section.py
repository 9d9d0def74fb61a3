"""A fleet in a run's report: per stage, each server's share of the load, its hit ratio (the
server's word and the client's prediction), latency and failures; the imbalance (the busiest
server's load over the mean), and the stages where one server breaks while the others do not
(`hot-shard`) or a server was lost (`server-lost`, its outage counted on that server).

`fleet_section` is report.json's `fleet` object (absent for one server); behind a gateway
(`--fleet-metrics`) `gateway_section` gives it from each server's own counters instead.
`fleet_table` is the rows the terminal and the HTML page show.
"""

from __future__ import annotations

import math
import statistics

from hstu_replay.output.text import cell, fmt
from hstu_replay.report.flags import HOT_SHARD_P99_FACTOR
from hstu_replay.report.summary import goal_name, ms_per_logical_request
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

def _share(part: float, whole: float) -> float:
    return part / whole if whole else math.nan


def _row(index: int, address: str, s: BinStats, batch: int, total: int) -> dict:
    sent = s.requests + s.errors
    return {
        "server": address, "index": index, "requests": s.requests, "errors": s.errors, "failures": s.failures,
        "throughput_rps": s.throughput, "share": _share(sent, total),
        "observed_ratio": s.observed_ratio, "predicted_ratio": s.predicted_ratio,
        "achieved_ratio": s.achieved_ratio, "hit_source": s.hit_source,
        "hit_disagreements": s.hit_disagreements,
        "p50_ms": s.latency.percentile_ms(50), "p99_ms": s.latency.percentile_ms(99),
        "p99_ci_ms": list(s.latency.percentile_interval_ms(99)),
        "mean_ms": s.latency.mean_ms, "ms_per_logical_request": ms_per_logical_request(s.latency.mean_ms, batch),
        "prime_requests": s.prime_requests, "server_down_s": s.server_down_s,
    }


def _flags(rows: list[dict]) -> list[dict]:
    flags = []
    for r in rows:
        if r["server_down_s"] > 0:
            flags.append({"flag": "server-lost", "server": r["server"],
                          "reason": f"server {r['server']} was unreachable for {r['server_down_s']:.1f} s"})
    for r in rows:
        others = [o for o in rows if o is not r]
        if not others or r["server_down_s"] > 0:
            continue
        if r["failures"] and not any(o["failures"] for o in others):
            flags.append({"flag": "hot-shard", "server": r["server"],
                          "reason": f"server {r['server']} failed {r['failures']} requests, the others none"})
            continue
        p99s = [o["p99_ms"] for o in others if not math.isnan(o["p99_ms"])]
        surely = r["p99_ci_ms"][0]  # the low end of its p99's 95% interval: one slow request is not a hot shard
        if p99s and not math.isnan(surely) and surely > HOT_SHARD_P99_FACTOR * statistics.median(p99s):
            flags.append({"flag": "hot-shard", "server": r["server"],
                          "reason": f"server {r['server']}'s p99 {r['p99_ms']:.1f} ms (at least {surely:.1f} ms, 95% "
                                    f"interval) is over {HOT_SHARD_P99_FACTOR:g}x the others' median "
                                    f"{statistics.median(p99s):.1f} ms"})
    return flags


def _stage(key: BinKey, stats: RunStats, addresses: tuple[str, ...]) -> dict:
    each = [stats.servers.get((key, i)) or BinStats() for i in range(len(addresses))]
    loads = [s.requests + s.errors for s in each]
    total = sum(loads)
    rows = [_row(i, a, s, key.batch_size, total) for i, (a, s) in enumerate(zip(addresses, each))]
    mean = total / len(loads)
    hottest = max(range(len(loads)), key=loads.__getitem__)
    return {"name": key.name(), "batch_size": key.batch_size, "target_ratio": key.goal_ratio,
            "imbalance": _share(loads[hottest], mean), "hottest": addresses[hottest],
            "flags": _flags(rows), "servers": rows}


def fleet_section(stats: RunStats, addresses: tuple[str, ...], routing: str) -> dict | None:
    """Per-stage, per-server figures of a run against several servers; None for one server."""
    if len(addresses) < 2:
        return None
    return {"routing": routing, "servers": list(addresses),
            "stages": [_stage(key, stats, addresses) for key in sorted(stats.bins)]}


def _backend_row(index: int, url: str, f, total: int) -> dict:
    return {"server": url, "index": index, "requests": f.requests, "share": _share(f.requests or 0, total),
            "observed_ratio": math.nan if f.hit_ratio is None else f.hit_ratio, "hit_tokens": f.hit_tokens,
            "computed_tokens": f.computed_tokens, "hit_source": "observed" if f.hit_ratio is not None else None}


def gateway_section(backend_stages: dict, urls: tuple[str, ...], stats: RunStats) -> dict | None:
    """Behind a gateway: per stage, what each server's own KV-cache counters say of its measured
    window (`backend_stages`: stage name -> `metrics.backends.ServerFigures` per server)."""
    if not urls:
        return None
    stages = []
    for key in sorted(stats.bins):
        figures = backend_stages.get(key.name())
        if figures is None:
            continue
        loads = [f.requests or 0 for f in figures]
        total = sum(loads)
        hottest = max(range(len(loads)), key=loads.__getitem__)
        stages.append({"name": key.name(), "batch_size": key.batch_size, "target_ratio": key.goal_ratio,
                       "imbalance": _share(loads[hottest], total / len(loads)), "hottest": urls[hottest],
                       "flags": [], "servers": [_backend_row(i, u, f, total)
                                                for i, (u, f) in enumerate(zip(urls, figures))]})
    return {"routing": "gateway", "servers": list(urls), "stages": stages}


def with_fleet_flags(report: dict) -> None:
    """The fleet's flags also on their stages (every output shows a stage's flags; thresholds fail on them)."""
    fleet = report.get("fleet")
    if not fleet:
        return
    flags = {s["name"]: s["flags"] for s in fleet["stages"]}
    for stage in report["stages"]:
        stage["flags"] = stage["flags"] + [{"flag": f["flag"], "reason": f["reason"]}
                                           for f in flags.get(stage["name"], [])]
    for b in report["bins"]:
        b["flags"] = b["flags"] + [f["flag"] for f in flags.get(b["name"], []) if f["flag"] not in b["flags"]]


FLEET_HEADER = ["batch", "target", "server", "requests", "share", "req/s", "observed", "predicted", "p50 ms",
                "p99 ms", "ms/logical", "errors", "down s"]


def fleet_table(report: dict) -> list[list[str]]:
    """Header plus one row per (stage, server), then the stage's imbalance."""
    rows = [list(FLEET_HEADER)]
    for stage in report["fleet"]["stages"]:
        for r in stage["servers"]:  # behind a gateway a server's own counters say less: the rest is `-`
            g = r.get
            rows.append([str(stage["batch_size"]), goal_name(stage["target_ratio"]), r["server"], str(r["requests"]),
                         fmt(r["share"], ".3f"), fmt(g("throughput_rps"), ".1f"), fmt(r["observed_ratio"], ".3f"),
                         fmt(g("predicted_ratio"), ".3f"), fmt(g("p50_ms"), ".2f"), fmt(g("p99_ms"), ".2f"),
                         fmt(g("ms_per_logical_request"), ".3f"), cell(g("failures")), fmt(g("server_down_s"), ".1f")])
        rows.append([str(stage["batch_size"]), goal_name(stage["target_ratio"]), "imbalance (busiest / mean)",
                     "", fmt(stage["imbalance"], ".2f"), "", "", "", "", "", "", "", ""])
    return rows
