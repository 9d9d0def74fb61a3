"""The hit-ratio-vs-budget curve of a store's natural replay: one pass against one simulation per budget.

    hstu-replay data synth --full --out runs/raw-full --seed 1 && hstu-replay data prepare runs/raw-full --out runs/store-full
    python -m bench.cache_curve --store runs/store-full --budgets 500000,2000000,5000000

In the order printed: the trace (visits, requests, history tokens); the one-pass curve's time,
its peak Python heap (tracemalloc, a second pass) and the process's peak RSS beside the store's
size on disk; then, per budget, a direct replay of the same trace through the target's
`CacheLedger` (one simulation per budget), its time and its hit tokens against the curve's
(they must be equal: the run fails otherwise). The speed figure is the ratio of the one pass to
the simulations of the listed budgets, both in this process.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

from bench.harness import table, this_command
from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.analysis.cache_curve import cache_curve
from hstu_replay.plan.timeline import build_trace, group_requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--budgets", default="500000,2000000,5000000")
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--max-history", type=int, default=4096)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    store = SequenceStore.open(args.store)
    store_mb = sum(f.stat().st_size for f in Path(args.store).glob("*.npy")) / 1e6

    began = time.perf_counter()
    trace = build_trace(store, args.candidates, Limits(max_history=args.max_history), 1)
    bounds = group_requests(trace, 0, 1)
    trace_s = time.perf_counter() - began
    began = time.perf_counter()
    curve = cache_curve(trace.users, trace.tokens, bounds)
    curve_s = time.perf_counter() - began
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tracemalloc.start()
    cache_curve(trace.users, trace.tokens, bounds)
    heap_mb = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()

    print(f"# {this_command()}")
    print(f"store {args.store}: {store.num_users:,} users, {store.num_events:,} events, {store_mb:,.0f} MB of arrays")
    print(f"trace: {len(trace):,} visits (= requests), {curve.total_tokens:,} history tokens, "
          f"history cap {trace.history_cap}, built in {trace_s:.2f} s")
    print(table(["one-pass curve", "seconds", "peak Python heap MB", "process peak RSS MB", "steps",
                 "every return hits from (tokens)", "ratio there"],
                [["all budgets", curve_s, heap_mb, rss_mb, len(curve.points()), curve.all_fit_tokens, curve.max_ratio]]))
    rows, sim_s, wrong = [], 0.0, 0
    users, tokens = trace.users.tolist(), trace.tokens.tolist()
    for budget in budgets:
        ledger = CacheLedger(budget, 32)
        began = time.perf_counter()
        hits = sum(ledger.serve(((u, t),)).hits[0] for u, t in zip(users, tokens))
        seconds = time.perf_counter() - began
        sim_s += seconds
        wrong += hits != curve.hit_tokens(budget)
        rows.append([budget, seconds, hits / curve.total_tokens, curve.ratio(budget),
                     "equal" if hits == curve.hit_tokens(budget) else "DIFFERENT"])
    print(table(["budget (tokens)", "ledger simulation s", "ledger ratio", "curve ratio", "hit tokens"], rows))
    print(f"one pass for every budget: {curve_s:.2f} s; {len(budgets)} ledger simulations: {sim_s:.2f} s "
          f"({sim_s / len(budgets) / curve_s:.2f} x the one pass each)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
