"""`hstu-replay plan export-perf-analyzer`: a planned trace as perf_analyzer `--input-data` JSON;
`hstu-replay plan cache-curve` (the offline analysis's, `analysis.cli`): a store's natural-replay hit
ratio at every KV-cache budget.

The requests come from the sources the load test uses (dump replay or session replay, one
virtual user's cache keys), primes included in send order.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from hstu_replay.analysis.cli import add_cache_curve
from hstu_replay.arguments import (
    BATCH_SIZE, CANDIDATES, DUMP_DIR, MAX_VALUES, REPLAY_SEED, SMALL_MAX_HISTORY, STORE, TRITON_MODEL, Option,
    batch_number, hit_ratio_number, within,
)
from hstu_replay.errors import ConfigError
from hstu_replay.interface import INTERFACES, PUBLISHED_LIMITS, Limits, ModelInterface
from hstu_replay.plan.keys import KeyAllocator

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

    add_cache_curve(actions)


def _check(args: argparse.Namespace) -> tuple[ModelInterface, float, Limits]:
    if (args.dump_dir is None) == (args.store is None):
        raise ConfigError("give exactly one of --dump-dir DIR or --store STORE")
    interface = MODELS.get(args.model)
    if interface is None:
        raise ConfigError(f"--model {args.model!r}: use one of {', '.join(MODELS)}")
    ratio = args.hit_ratio if args.hit_ratio is not None else (0.5 if interface.uses_cache else 0.0)
    hit_ratio_number("--hit-ratio", ratio)
    if ratio > 0 and not interface.uses_cache:
        raise ConfigError(f"--hit-ratio {ratio}: model {args.model} has no KV cache; use 0")
    limits = Limits(max_history=args.max_history, max_values=args.max_values)
    batch_number("--batch-size", args.batch_size, limits)
    within(("--candidates", args.candidates, 1, limits.max_candidates),
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
    workload = open_workload(name, WorkloadOptions(path=path, candidates=args.candidates, limits=limits,
                                                   seed=args.seed, worker_index=args.worker_index,
                                                   worker_count=args.worker_index + 1))
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

