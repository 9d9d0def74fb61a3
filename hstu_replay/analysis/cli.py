"""`hstu-replay plan cache-curve`: a store's natural-replay hit ratio at every KV-cache budget.

The command sits in the `plan` group (`plan.cli` adds it there); what it computes and writes is
this package's: the store's curve (`store_curve`) and its files (`curve_files`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from hstu_replay.arguments import (
    BUDGETS, CANDIDATES, MAX_HISTORY, MAX_VALUES, OFFLOAD_CHUNK_TOKENS, OVER_LIMIT, PAGE_TOKENS, REBASE_KEEP,
    STORE, TIME_SLICE_MS, VISITS_PER_REQUEST, Option, batch_number, numbers, within,
)
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.process import long_running


def add_cache_curve(actions) -> None:
    """`cache-curve` among the `plan` group's actions."""
    curve = actions.add_parser("cache-curve", help="hit ratio vs KV-cache budget of a store's natural replay",
                               epilog="example: hstu-replay plan cache-curve --store runs/store "
                                      "--budgets 100000,1000000 --out runs/curve")
    STORE.add_to(curve, help="prepared store to replay", required=True)
    BUDGETS.add_to(curve, default="", help="budgets (tokens) to report, e.g. 100000,1000000 "
                                           "(the whole curve is written anyway)")
    Option("--out", "write curve.json, curve.csv and curve.svg here", metavar="DIR").add_to(curve)
    CANDIDATES.add_to(curve, help="candidates per visit, at most")
    MAX_HISTORY.add_to(curve)
    OVER_LIMIT.add_to(curve)
    REBASE_KEEP.add_to(curve)
    MAX_VALUES.add_to(curve)
    VISITS_PER_REQUEST.add_to(curve)
    TIME_SLICE_MS.add_to(curve, help="visits of one time slice share a request (default 0: one visit per request)")
    PAGE_TOKENS.add_to(curve)
    Option("--host-budgets", "host-tier budgets (tokens) behind each GPU budget of --budgets: the token hit ratio "
           "per tier over that grid (NVIDIA's cpu_cache_gb is 1 GB)", "", metavar="TOKENS,...").add_to(curve)
    Option("--offload-mode", "how the host tier is filled: native (whole chunks of --offload-chunk-tokens, the "
           "reference target's default) or flexkv (every user after each forward)", "native").add_to(curve)
    OFFLOAD_CHUNK_TOKENS.add_to(curve, help="--offload-mode native: the server's chunk in tokens (its "
                                            "--offload-chunk-tokens)")
    curve.set_defaults(func=_cache_curve)


def _token_list(flag: str, text: str) -> list[int]:
    return list(numbers(flag, text, 0, integral=True, blanks=True, digits=True,
                        form="whole token counts, e.g. 100000,1000000"))


@long_running
def _cache_curve(args: argparse.Namespace) -> int:
    from hstu_replay.analysis.curve_files import curve_json, tiers_json, tiers_lines, write_curve
    from hstu_replay.analysis.store_curve import CurveOptions, store_curves
    from hstu_replay.plan.over_limit import HistoryPolicy, accounts_line
    from hstu_replay.plan.tiers import OFFLOAD_MODES

    limits = Limits(max_history=args.max_history, max_values=args.max_values)
    batch_number("--batch-size", args.batch_size, limits)
    within(("--candidates", args.candidates, 1, limits.max_candidates),
           ("--max-history", args.max_history, 1, None),
           ("--max-values", args.max_values, 1, None),
           ("--time-slice-ms", args.time_slice_ms, 0, None),
           ("--page-tokens", args.page_tokens, 1, None),
           ("--offload-chunk-tokens", args.offload_chunk_tokens, 1, None))
    budgets = _token_list("--budgets", args.budgets)
    host_budgets = _token_list("--host-budgets", args.host_budgets)
    if args.offload_mode not in OFFLOAD_MODES:
        raise ConfigError(f"--offload-mode {args.offload_mode!r}: use {' or '.join(OFFLOAD_MODES)}")
    if host_budgets and not budgets:
        raise ConfigError(f"--host-budgets {args.host_budgets!r}: give the GPU budgets of the grid with --budgets")
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: exists and is not a folder")
    options = CurveOptions(args.store, args.candidates, limits, args.batch_size, args.time_slice_ms, args.page_tokens,
                           HistoryPolicy.of(args.over_limit, args.rebase_keep), args.offload_chunk_tokens)
    curve, tiers, info = store_curves(options, args.offload_mode if host_budgets else None)
    summary = curve_json(curve, info, options, budgets)
    if tiers is not None:
        summary["tiers"] = tiers_json(tiers, budgets, host_budgets)
    print(f"{args.store}: {info['visits']:,} visits of {info['users']:,} users in {curve.requests:,} requests, "
          f"{curve.total_tokens:,} history tokens; curve computed in {info['seconds']:.2f} s")
    print(accounts_line(info["visit_kinds"]))
    span_h = info["span_ms"] / 3_600_000
    print(f"log span {span_h / 24:.2f} days (first to last replayed visit): a replay at --time-scale 144 takes "
          f"{span_h / 144:.2f} h (--stage-seconds {math.ceil(span_h * 3600 / 144)})")
    print(f"every return hits from {curve.all_fit_tokens:,} tokens (ratio {curve.max_ratio:.4f}); "
          f"exact from {curve.exact_from_tokens:,} tokens (the largest request)")
    for b in summary["budgets"]:
        print(f"  budget {b['budget_tokens']:>14,} tokens: hit ratio {b['hit_ratio']:.4f}"
              + ("" if b["exact"] else " (below the largest request: approximate)"))
    if tiers is not None:
        print(f"two tiers ({args.offload_mode} offload), token hit ratio per tier:")
        print("\n".join(tiers_lines(summary["tiers"]["grid"])))
    if args.out is not None:
        for path in write_curve(Path(args.out), curve, summary):
            print(f"wrote {path}")
    return 0
