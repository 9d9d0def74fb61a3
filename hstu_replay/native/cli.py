"""`hstu-replay native build|replay`: check a dump against model.pt2 from C++ (libtorch only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import hstu_replay.native.replay as native


def add_commands(groups: Any) -> None:
    reference = groups.add_parser("native", aliases=["reference"],
                                  help="native C++ replay of reference dumps through model.pt2")
    commands = reference.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = commands.add_parser("build", help="build the C++ replay program with CMake (cached)")
    _build_dir_arg(build)
    build.set_defaults(func=_build)

    replay = commands.add_parser(
        "replay", help="run every dump batch through the package in C++ and compare with its logits "
                       "(exit 0 all within tolerance, 2 some batch is not)")
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--repository", help="Triton repository: uses its hstu_gr_ranking/1/model.pt2")
    source.add_argument("--package", help="an AOTInductor package taking (values, lengths, num_candidates)")
    replay.add_argument("--dump-dir", required=True, help="directory of batch_NNNNNN_*.pt files")
    replay.add_argument("--tolerance", type=float, default=native.DEFAULT_TOLERANCE,
                        help="max absolute logit difference accepted")
    written = replay.add_mutually_exclusive_group()
    written.add_argument("--write-reference", metavar="NAME",
                         help="also write the C++ outputs as batch_NNNNNN_<NAME>.pt into the dump directory")
    written.add_argument("--produce-reference", action="store_true",
                         help="write the C++ outputs as batch_NNNNNN_compiled_logits.pt into a dump that has no "
                              "reference logits yet (nothing is compared)")
    replay.add_argument("--timeout", type=float, default=native.REPLAY_TIMEOUT_S, help="seconds for the whole replay")
    _build_dir_arg(replay)
    replay.set_defaults(func=_replay)


def _build_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--build-dir", default=None, help=f"CMake build directory (default {native.DEFAULT_BUILD_DIR})")


def _build(args: argparse.Namespace) -> int:
    print(native.build(args.build_dir))
    return 0


def _replay(args: argparse.Namespace) -> int:
    if args.repository:
        from hstu_replay.interface import NOCACHE
        from hstu_replay.server.repository import RepositoryLayout

        package = RepositoryLayout(Path(args.repository)).package(NOCACHE)
    else:
        package = Path(args.package)
    if args.produce_reference:
        written = native.produce_reference(package, args.dump_dir, build_dir=args.build_dir, timeout=args.timeout)
        print(f"hstu-replay: wrote compiled_logits for {written} batches into {args.dump_dir}")
        return 0
    result = native.replay(package, args.dump_dir, args.tolerance, args.write_reference,
                           build_dir=args.build_dir, timeout=args.timeout)
    sys.stdout.write(result.output)
    sys.stdout.flush()
    return result.returncode
