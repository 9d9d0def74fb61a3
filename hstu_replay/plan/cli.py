"""`hstu-replay plan export-perf-analyzer`: a planned trace as perf_analyzer `--input-data` JSON;
`hstu-replay plan cache-curve`: a store's natural-replay hit ratio at every KV-cache budget.

The requests come from the sources the load test uses (dump replay or session replay, one
virtual user's cache keys), primes included in send order.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from hstu_replay.arguments import (
    BATCH_SIZE, BUDGETS, CANDIDATES, DUMP_DIR, MAX_HISTORY, MAX_VALUES, OFFLOAD_CHUNK_TOKENS, OVER_LIMIT, PAGE_TOKENS,
    REBASE_KEEP, REPLAY_SEED, SMALL_MAX_HISTORY, STORE, TIME_SLICE_MS, TRITON_MODEL, VISITS_PER_REQUEST, Option,
    numbers,
)
from hstu_replay.errors import ConfigError
from hstu_replay.interface import INTERFACES, PUBLISHED_LIMITS, Limits, ModelInterface
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.process import long_running

MODELS: dict[str, ModelInterface] = {i.model_name: i for i in INTERFACES.values()}


def add_commands(groups) -> None:
    plan = groups.add_parser("plan", help="plan request traces for other tools",
                             epilog="example: hstu-replay plan cache-curve --store runs/store --out runs/curve")
    actions = plan.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    export = actions.add_parser("export-perf-analyzer",
                                help="write planned requests as perf_analyzer --input-data JSON",
                                epilog="example: hstu-replay plan export-perf-analyzer --dump-dir runs/dumps "
                                       "--out trace.json")
    DUMP_DIR.add_to(export, help="replay the users of this NVIDIA-format dump")
    STORE.add_to(export, help="replay sessions of this prepared store")
    Option("--out", "JSON file to write", metavar="TRACE_JSON").add_to(export, required=True)
    TRITON_MODEL.but(flag="--model").add_to(export, help=f"model whose inputs are written: {', '.join(MODELS)}")
    Option("--hit-ratio", "target KV-cache hit ratio (default 0.5; 0 for a model without cache)", type=float
           ).add_to(export)
    # perf_analyzer replays one trace file: full requests by default
    BATCH_SIZE.add_to(export, default=PUBLISHED_LIMITS.max_batch)
    Option("--requests", "measured requests; priming requests come on top", 100, int).add_to(export)
    CANDIDATES.add_to(export, help="candidates per user, sessions")
    SMALL_MAX_HISTORY.add_to(export)
    MAX_VALUES.add_to(export)
    REPLAY_SEED.but(flag="--seed", dest=None).add_to(export)
    Option("--worker-index", "owner of the cache keys: give each concurrent perf_analyzer its own", 0, int
           ).add_to(export)
    Option("--key-nonce", "fixed run nonce of the cache keys (default random: fresh keys every export)", type=int
           ).add_to(export)
    export.set_defaults(func=_export)

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


def _within(*checks: tuple[str, int, int, int | None]) -> None:
    """Each (flag, value, low, high) with low <= value (<= high); else one line naming the first that is not."""
    for name, value, low, high in checks:
        if value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise ConfigError(f"{name} must be {bounds}, got {value}")


def _token_list(flag: str, text: str) -> list[int]:
    return list(numbers(flag, text, 0, integral=True, blanks=True, digits=True,
                        form="whole token counts, e.g. 100000,1000000"))


def _check(args: argparse.Namespace) -> tuple[ModelInterface, float, Limits]:
    if (args.dump_dir is None) == (args.store is None):
        raise ConfigError("give exactly one of --dump-dir DIR or --store STORE")
    interface = MODELS.get(args.model)
    if interface is None:
        raise ConfigError(f"--model {args.model!r}: use one of {', '.join(MODELS)}")
    ratio = args.hit_ratio if args.hit_ratio is not None else (0.5 if interface.uses_cache else 0.0)
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"--hit-ratio must be within 0..1, got {ratio}")
    if ratio > 0 and not interface.uses_cache:
        raise ConfigError(f"--hit-ratio {ratio}: model {args.model} has no KV cache; use 0")
    limits = Limits(max_history=args.max_history, max_values=args.max_values)
    _within(("--batch-size", args.batch_size, 1, limits.max_batch),
            ("--candidates", args.candidates, 1, limits.max_candidates),
            ("--requests", args.requests, 1, None),
            ("--max-history", args.max_history, 1, None),
            ("--max-values", args.max_values, 1, None),
            ("--seed", args.seed, 0, None),
            ("--worker-index", args.worker_index, 0, None))
    out = Path(args.out)
    if not out.parent.is_dir():
        raise ConfigError(f"--out {args.out}: folder {out.parent} does not exist")
    return interface, ratio, limits


def _source(args: argparse.Namespace, limits: Limits):
    from hstu_replay.plan.workloads import WorkloadOptions, open_workload

    name, path = ("dumps", args.dump_dir) if args.dump_dir is not None else ("sessions", args.store)
    workload = open_workload(name, WorkloadOptions(path, args.candidates, limits, args.seed,
                                                   args.worker_index, args.worker_index + 1))
    workload.check((args.batch_size,))
    return workload.source(KeyAllocator(args.worker_index, 0, args.key_nonce))


def _export(args: argparse.Namespace) -> int:
    from hstu_replay.plan.perf_analyzer import plan_trace, write_trace

    interface, ratio, limits = _check(args)
    began = time.perf_counter()
    source = _source(args, limits)
    summary = write_trace(plan_trace(source, interface, ratio, args.batch_size, args.requests), interface, args.out)
    print(f"{args.out}: {summary.entries} requests ({summary.measured} measured, {summary.primes} primes), "
          f"{summary.users} user slots, {summary.bytes_written / 1e6:.1f} MB in {time.perf_counter() - began:.1f} s; "
          f"replay: perf_analyzer -m {interface.model_name} -i grpc --input-data {args.out} --concurrency-range 1")
    if interface.uses_cache:
        print(f"note: perf_analyzer loops over the list; after {summary.entries} requests the keys are warm "
              f"and primes shorten held histories: stop it there (--request-count {summary.entries}) "
              f"or empty the cache between passes")
    return 0


@long_running
def _cache_curve(args: argparse.Namespace) -> int:
    from hstu_replay.plan.over_limit import HistoryPolicy, accounts_line
    from hstu_replay.plan.tiers import OFFLOAD_MODES
    from hstu_replay.plan.curve_files import curve_json, tiers_json, tiers_lines, write_curve
    from hstu_replay.plan.store_curve import CurveOptions, store_curves

    limits = Limits(max_history=args.max_history, max_values=args.max_values)
    _within(("--batch-size", args.batch_size, 1, limits.max_batch),
            ("--candidates", args.candidates, 1, limits.max_candidates),
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
