"""How the natural replay's planning grows with the log: stores of several sizes side by side.

    python -m bench.natural_scale --stores runs/store1k,runs/store3k,runs/store9k

For each store, each piece runs in a child of its own (`bench.harness.measured_child`: its wall
time and its own peak RSS): opening + `inspect`'s summary + `verify`; the one-pass cache curve
under each over-limit policy (skip is NVIDIA's rule), and skip's two-tier curve (native offload);
the timeline trace a worker of shard 0/n builds, for n in --shards. Ratios are against the first
store of the same run (the reference), beside its ratio of events. Reported with the curve: the
budget a 90% token hit ratio needs at --max-history items, and the ratio at the published pool.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from bench.harness import ROOT, measured_child, table, this_command

#: The reference server's published GPU pool: 102,400 pages of 32 tokens.
PUBLISHED_POOL_TOKENS = 102_400 * 32
TARGET_RATIO = 0.9


def piece_open(store: str, args) -> dict:
    from hstu_replay.data.inspect import summarize
    from hstu_replay.data.store import SequenceStore

    opened = SequenceStore.open(store)
    began = time.perf_counter()
    summary = summarize(opened)
    summarized = time.perf_counter() - began
    opened.verify()
    return {"events": summary.events, "users": summary.users, "megabytes": summary.bytes / 1e6,
            "summary_s": round(summarized, 2)}


def piece_curve(store: str, args, policy: str, tiers: bool) -> dict:
    from hstu_replay.interface import Limits
    from hstu_replay.plan.over_limit import HistoryPolicy
    from hstu_replay.plan.store_curve import CurveOptions, store_curves

    options = CurveOptions(store=store, limits=Limits(max_history=args.max_history),
                           policy=HistoryPolicy.of(policy, 0.5))
    curve, tier, info = store_curves(options, "native" if tiers else None)
    need = curve.budget_for(TARGET_RATIO)
    return {"visits": info["visits"], "budget_90": need, "ratio_at_pool": round(curve.ratio(PUBLISHED_POOL_TOKENS), 4),
            "two_tier": tier is not None}


def piece_shard(store: str, args, count: int) -> dict:
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.interface import Limits
    from hstu_replay.plan.timeline import build_trace, first_visit_ms, shard_users

    opened = SequenceStore.open(store)
    limits = Limits(max_history=args.max_history)
    trace = build_trace(opened, 16, limits, 1, users=shard_users(len(opened), 0, count))
    first_visit_ms(opened, 16, limits, 1)
    return {"visits": len(trace)}


def pieces(args) -> dict[str, tuple]:
    out = {"open+inspect+verify": (piece_open,)}
    for policy in args.policies.split(","):
        out[f"curve {policy}"] = (piece_curve, policy, False)
    out["curve skip, two tiers"] = (piece_curve, "skip", True)
    for n in (int(n) for n in args.shards.split(",")):
        out[f"worker trace, shard 0/{n}"] = (piece_shard, n)
    return out


def worker(args) -> None:
    function, *extra = pieces(args)[args.piece]
    began = time.perf_counter()
    result = function(args.worker_store, args, *extra)
    result["seconds"] = time.perf_counter() - began
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", required=True, help="comma-separated store directories, smallest first")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "natural-scale")
    parser.add_argument("--max-history", type=int, default=4096)
    parser.add_argument("--policies", default="skip,oldest,rebase")
    parser.add_argument("--shards", default="1,8,64")
    parser.add_argument("--only", default="", help="comma-separated piece names to run (default: all)")
    parser.add_argument("--piece", help=argparse.SUPPRESS)
    parser.add_argument("--worker-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.piece:
        worker(args)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    stores = args.stores.split(",")
    chosen = [name for name in pieces(args) if not args.only or name in args.only.split(",")]
    results: dict[tuple[str, str], dict] = {}
    for s, store in enumerate(stores):
        for k, name in enumerate(chosen):
            command = [sys.executable, "-m", "bench.natural_scale", "--stores", args.stores, "--max-history",
                       str(args.max_history), "--policies", args.policies, "--shards", args.shards,
                       "--piece", name, "--worker-store", store]
            results[store, name] = measured_child(command, args.work / f"store{s}-piece{k}.log")
            print(f"{store}: {name}: {json.dumps(results[store, name])}", flush=True)
    events = {store: results[store, chosen[0]].get("events") for store in stores} if chosen[0] == "open+inspect+verify" else {}
    rows = []
    for name in chosen:
        reference = results[stores[0], name]
        for store in stores:
            r = results[store, name]
            growth = f"{events[store] / events[stores[0]]:.1f}" if events else ""
            extra = (f"visits {r['visits']:,}" if "visits" in r else f"{r['events']:,} events, {r['megabytes']:,.0f} MB")
            if "budget_90" in r:
                need = "none" if r["budget_90"] is None else f"{r['budget_90']:,}"
                extra += f"; 90% from {need} tokens; {r['ratio_at_pool']} at the published pool"
            rows.append([name, Path(store).name, growth, f"{r['seconds']:.1f}", f"{r['seconds'] / reference['seconds']:.2f}",
                         f"{r['peak_rss_mb']:,.0f}", f"{r['peak_rss_mb'] / reference['peak_rss_mb']:.2f}", extra])
    print()
    print(f"`{this_command()}`")
    print()
    print(table(["piece", "store", "x events", "seconds", "x time", "peak RSS MB", "x RSS", "figures"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
