"""`hstu-replay data ...`: synth, prepare, inspect and verify.

Handlers import pyarrow-backed modules lazily, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from hstu_replay.arguments import Option
from hstu_replay.data.limits import DEFAULT_MEMORY_GB
from hstu_replay.data.schema import DEFAULT_RELEASE, RELEASES
from hstu_replay.errors import ConfigError
from hstu_replay.process import long_running

STORED = Option("store", "prepared store", metavar="STORE")


def add_commands(groups) -> None:
    data = groups.add_parser("data", help="KuaiRand-1K raw logs -> compact sequence store",
                             epilog="example: hstu-replay data prepare runs/raw --out runs/store")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    synth = actions.add_parser("synth", help="write synthetic raw files of a KuaiRand release's schema and names",
                               epilog="example: hstu-replay data synth --out runs/raw --users 200 --seed 1")
    Option("--out", "folder for the CSVs", metavar="RAW_DIR").add_to(synth, required=True)
    Option("--release", "whose file names and layout to write (27k: each standard log in part files)",
           DEFAULT_RELEASE, choices=tuple(RELEASES)).add_to(synth)
    Option("--users", "number of users", type=int).add_to(synth)
    Option("--seed", "random seed", 0, int).add_to(synth)
    Option("--scale", "events per user relative to the real ~11.7k (default 1.0)", type=float).add_to(synth)
    Option("--full", "the release's published size (1k: 1,000 users, ~11.7M standard events, ~0.9 GB; "
           "27k: 27,285 users, ~322M, ~24 GB)", type=bool).add_to(synth)
    synth.set_defaults(func=_synth)

    prepare = actions.add_parser("prepare", help="build the sequence store from raw files",
                                 epilog="example: hstu-replay data prepare runs/raw --out runs/store")
    Option("raw_dir", "folder holding one KuaiRand release's CSVs (1K, 27K with its part files, or Pure)",
           metavar="RAW_DIR").add_to(prepare)
    Option("--out", "store directory", metavar="STORE").add_to(prepare, required=True)
    Option("--include-random", "also append the random-exposure log's events (NVIDIA's pipeline does not)",
           type=bool).add_to(prepare)
    Option("--memory-gb", "peak memory of the preparation, whatever the log size (events wait on disk "
           "beside the store)", DEFAULT_MEMORY_GB, float).add_to(prepare)
    prepare.set_defaults(func=_prepare)

    inspect = actions.add_parser("inspect", help="summarize a store",
                                 epilog="example: hstu-replay data inspect runs/store --json")
    STORED.add_to(inspect)
    Option("--json", "one JSON object with per-user digests", type=bool).add_to(inspect)
    inspect.set_defaults(func=_inspect)

    verify = actions.add_parser("verify", help="recompute a store's checksum",
                                epilog="example: hstu-replay data verify runs/store")
    STORED.add_to(verify)
    verify.set_defaults(func=_verify)


def _synth(args: argparse.Namespace) -> int:
    from hstu_replay.data.synth import full_size, synthesize

    if args.full:
        if args.users is not None or args.scale is not None:
            raise ConfigError("--full fixes --users and --scale to the release's size; give one or the other")
        users, scale = full_size(RELEASES[args.release])
    else:
        if args.users is None:
            raise ConfigError("give --users N (or --full)")
        users, scale = args.users, 1.0 if args.scale is None else args.scale
    if users < 1:
        raise ConfigError(f"--users must be >= 1, got {users}")
    if not scale > 0:
        raise ConfigError(f"--scale must be > 0, got {scale}")
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    start = time.perf_counter()
    report = synthesize(args.out, users, args.seed, scale, args.release)
    print(f"{report.line()} in {time.perf_counter() - start:.1f} s")
    return 0


@long_running
def _prepare(args: argparse.Namespace) -> int:
    from hstu_replay.data.bounded import prepare_bounded

    start = time.perf_counter()
    meta = prepare_bounded(args.raw_dir, args.out, include_random=args.include_random,
                           memory_gb=args.memory_gb)
    print(
        f"prepared {args.out}: {meta.users:,} users, {meta.events:,} events "
        f"(dropped {meta.dropped.one_period_only} users in one period only, "
        f"{meta.dropped.no_user_features} without user features) "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.data.inspect import format_summary, per_user_digest, summarize

    store = SequenceStore.open(args.store)
    if args.json:
        json.dump(per_user_digest(store), sys.stdout, separators=(",", ":"))
        sys.stdout.write("\n")
    else:
        print(format_summary(summarize(store)))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from hstu_replay.data.store import SequenceStore

    store = SequenceStore.open(args.store)
    start = time.perf_counter()
    store.verify()
    print(f"{args.store}: checksum ok ({store.num_events:,} events, "
          f"{time.perf_counter() - start:.1f} s)")
    return 0
