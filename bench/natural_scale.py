"""How the natural replay's planning grows with the log: stores of several sizes side by side.

    python -m bench.natural_scale --stores runs/store1k,runs/store3k,runs/store9k

For each store, each piece runs in a child of its own (`bench.harness.measured_child`: its wall
time and its own peak RSS): opening + `inspect`'s summary + `verify`; the one-pass cache curve
under each over-limit policy (skip is NVIDIA's rule), one tier and two (native offload);
the timeline trace a worker of shard 0/n builds, for n in --shards; a real Locust worker replaying
the store's sessions against the do-nothing model (its memory); and with --repository, `capacity
natural` end to end against the built-in target. Ratios are against the first store of the same
run (the reference), beside its ratio of events. Reported with the curve: the budget a 90% token
hit ratio needs at --max-history items, and the ratio at the published pool.
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
#: `capacity natural`'s run: the small CPU model's longest history, a traffic level this machine
#: serves, how often the process tree's memory is sampled, and a bound on the whole run
CAPACITY_HISTORY = 256
CAPACITY_RATE = 20
SAMPLE_S = 0.5
CAPACITY_TIMEOUT_S = 3600
#: the worker piece's run
WORKER_SECONDS = 20
WORKER_USERS = 4


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
    from hstu_replay.analysis.store_curve import CurveOptions, store_curves

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


def label(store: str) -> str:
    """A store's name for the files of its runs: its folder and the one above (stores are often
    all called `store`)."""
    path = Path(store).resolve()
    return f"{path.parent.name}-{path.name}"


def piece_capacity(store: str, args) -> dict:
    """`capacity natural` end to end, as a user runs it: the curve picks the budgets, each is served
    by a fresh built-in target and replayed naturally by Locust. Beside its wall time: the peak RSS
    of its largest process (planner, Locust or server, from the kernel's account of children) and
    the peak of the whole tree's RSS added up, sampled every SAMPLE_S."""
    from bench.harness import MemoryPeaks
    from hstu_replay.process import Child

    out = args.work / f"capacity-{label(store)}"
    command = [sys.executable, "-m", "hstu_replay.cli", "capacity", "natural", "--store", store,
               "--repository", args.repository, "--slo-p99-ms", "2000", "--request-rate", str(CAPACITY_RATE),
               "--curve-ratios", "0.5,0.9", "--step-seconds", "20", "--warmup-seconds", "5", "--users", "2",
               "--max-history", str(CAPACITY_HISTORY), "--serve-args", "--threads 1", "--out", str(out)]
    child = Child(command, args.work / f"capacity-{label(store)}.log", name="capacity natural", cwd=ROOT)
    child.start()
    try:
        peaks = MemoryPeaks(child.pid)
        if not child.wait(CAPACITY_TIMEOUT_S, SAMPLE_S, peaks.sample):
            raise SystemExit(f"capacity natural: still running after {CAPACITY_TIMEOUT_S} s")
    finally:
        child.stop()
    if child.exited() not in ("exit 0", "exit 1"):  # 1: no budget met the SLO, still a full answer
        raise SystemExit(child.failure())
    result = json.loads((out / "capacity_natural.json").read_text())
    steps = [(s["budget_tokens"], s["computed"]["window_hit_ratio"], s["measured"]["hit_ratio"], s["measured"]["requests"])
             for s in result["steps"]]  # the curve's figure for the requests the step replayed, and the server's
    return {"largest_process_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "tree_peak_mb": peaks.tree_mib, "steps": steps, "answer": (result["answer"] or {}).get("budget_tokens")}


def piece_worker(store: str, args) -> dict:
    """A Locust worker replaying the store's sessions (hit ratio 0.5, batch 8, WORKER_USERS users)
    against the do-nothing model for WORKER_SECONDS: its peak RSS and the anonymous part of it
    (what is its own; the rest is file pages mapped, the store's among them, which the kernel
    can drop)."""
    from bench import harness
    from hstu_replay.interface import KVCACHE

    server = harness.start_null(KVCACHE, args.work / f"worker-null-{label(store)}.log")
    try:
        command = harness.workload_command(server.grpc_url, "grpc", ["--workload", "sessions", "--store", store,
                                                                     "--hit-ratios", "0.5"],
                                           args.work / f"worker-report-{label(store)}", WORKER_SECONDS,
                                           users=WORKER_USERS)
        child = harness.client(command, args.work / f"worker-{label(store)}.log")
        try:
            peaks = harness.MemoryPeaks(child.pid)
            child.wait(WORKER_SECONDS + 60, SAMPLE_S, peaks.sample)
        finally:
            child.stop()
    finally:
        server.stop()
    requests = harness.report_bin(args.work / f"worker-report-{label(store)}")["requests"]
    return {"worker_rss_mb": peaks.process_mib, "worker_anon_mb": peaks.process_anon_mib, "requests": requests}


def pieces(args) -> dict[str, tuple]:
    out = {"open+inspect+verify": (piece_open,)}
    for policy in args.policies.split(","):
        out[f"curve {policy}"] = (piece_curve, policy, False)
    for policy in args.policies.split(","):
        out[f"curve {policy} (two tiers)"] = (piece_curve, policy, True)
    for n in (int(n) for n in args.shards.split(",")):
        out[f"worker trace, shard 0/{n}"] = (piece_shard, n)
    out["locust worker (sessions)"] = (piece_worker,)
    if args.repository:
        out["capacity natural"] = (piece_capacity,)
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
    parser.add_argument("--repository", help="a compiled model repository (`hstu-replay server export`): "
                                             "adds the `capacity natural` piece against the built-in target")
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
                       "--work", str(args.work), *(("--repository", args.repository) if args.repository else ()),
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
            extra = (f"visits {r['visits']:,}" if "visits" in r
                     else f"{r['events']:,} events, {r['megabytes']:,.0f} MB" if "events" in r else "")
            if "worker_rss_mb" in r:
                extra = (f"worker peak RSS {r['worker_rss_mb']:,.0f} MB, of it anonymous {r['worker_anon_mb']:,.0f} MB; "
                         f"{r['requests']:,} requests")
            if "steps" in r:
                extra = (f"budgets {', '.join(f'{b:,} (curve {c:.4f}, server {m:.4f}, {n:,} requests)' for b, c, m, n in r['steps'])}; "
                         f"largest process {r['largest_process_mb']:,.0f} MB, tree {r['tree_peak_mb']:,.0f} MB")
            if "budget_90" in r:
                need = "none" if r["budget_90"] is None else f"{r['budget_90']:,}"
                extra += f"; 90% from {need} tokens; {r['ratio_at_pool']} at the published pool"
            rows.append([name, label(store), growth, f"{r['seconds']:.1f}", f"{r['seconds'] / reference['seconds']:.2f}",
                         f"{r['peak_rss_mb']:,.0f}", f"{r['peak_rss_mb'] / reference['peak_rss_mb']:.2f}", extra])
    print()
    print(f"`{this_command()}`")
    print()
    print(table(["piece", "store", "x events", "seconds", "x time", "peak RSS MB", "x RSS", "figures"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
