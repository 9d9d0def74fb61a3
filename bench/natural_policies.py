"""The natural replay's visits and cache curve under each `--over-limit` policy, side by side.

    hstu-replay data synth --out runs/raw-full --full --seed 0
    hstu-replay data prepare runs/raw-full --out runs/store-full
    python -m bench.natural_policies --store runs/store-full

For each history limit (`--limits`, default the model's 4,096 items and the small target's 256)
and each policy (skip, oldest, rebase), the trace and curve `plan cache-curve` computes
(`analysis.store_curve.store_curve`: one visit a request, batch 1, pages of `--page-tokens`): the visits of
each kind with their share of history tokens, the budget each policy needs for 0.8 / 0.9 / 0.95 of
history tokens from cache, and the curve's ratio at NVIDIA's published pools:
`inference_aoti/kvcache_cpp_runtime.yaml` (102,400 pages x 32 = 3,276,800 tokens) and
`inference_gr_ranking.py` (`base_cache_tokens` 10,240 x 32 = 327,680 tokens).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.harness import table, this_command
from hstu_replay.interface import Limits
from hstu_replay.plan.over_limit import KINDS, HistoryPolicy, OverLimit
from hstu_replay.analysis.store_curve import CurveOptions, store_curve

#: NVIDIA's published KV-cache pools, in tokens (pages of 32)
POOLS = {"gr_ranking 327,680": 10_240 * 32, "cpp_runtime 3,276,800": 102_400 * 32}
RATIOS = (0.8, 0.9, 0.95)


def _budget(value: int | None) -> str:
    return "never" if value is None else f"{value:,}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--limits", default="4096,256", help="history limits (--max-history), comma-separated")
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--rebase-keep", type=float, default=0.5)
    parser.add_argument("--page-tokens", type=int, default=32)
    args = parser.parse_args()
    limits = [int(x) for x in args.limits.split(",")]

    kinds_rows, curve_rows, notes = [], [], []
    began = time.perf_counter()
    for limit in limits:
        for policy in OverLimit:
            options = CurveOptions(args.store, args.candidates, Limits(max_history=limit), 1, 0, args.page_tokens,
                                   HistoryPolicy.of(policy.value, args.rebase_keep))
            curve, info = store_curve(options)
            section = info["visit_kinds"]
            name = [f"{limit:,}", policy.value]
            kinds_rows.append(name + [f"{section['visits']:,}"]
                              + [f"{section['kinds'][k]['visits']:,} ({100 * section['kinds'][k]['token_share']:.1f}%)"
                                 for k in KINDS])
            curve_rows.append(name + [f"{curve.total_tokens:,}"]
                              + [_budget(curve.budget_for(r)) for r in RATIOS]
                              + [f"{curve.ratio(p):.4f}" for p in POOLS.values()]
                              + [f"{curve.max_ratio:.4f} from {curve.all_fit_tokens:,}"])
            notes.append(f"{limit} {policy.value}: {curve.requests:,} requests, cap {info['history_cap']}, "
                         f"exact from {curve.exact_from_tokens:,} tokens, {info['seconds']:.1f} s")
            span_ms = info["span_ms"]
    print(f"# {this_command()}")
    print(f"store {args.store}: log span {span_ms / 86_400_000:.2f} days (first to last replayed visit); "
          f"{args.candidates} candidates, batch 1, one visit a request, pages of {args.page_tokens}, "
          f"rebase keeps {args.rebase_keep:g} of the limit")
    print("\nVisits by kind (share of history tokens; skipped: what they would have sent at the limit)\n")
    print(table(["max history", "policy", "visits", *KINDS], kinds_rows))
    print("\nBudget (tokens) for a share of history tokens from cache, and the curve at NVIDIA's pools\n")
    print(table(["max history", "policy", "history tokens sent", *(f"budget for {r:g}" for r in RATIOS),
                 *(f"ratio at {p}" for p in POOLS), "every return hits (ratio from tokens)"], curve_rows))
    print()
    print("\n".join(notes))
    print(f"total {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
