"""`hstu-replay cpp-replay build|run`: check a dump against model.pt2 from C++ (libtorch only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import hstu_replay.cpp_replay.replay as cpp_replay
from hstu_replay.arguments import DUMP_DIR, REPOSITORY, TOLERANCE, Option
from hstu_replay.process import long_running


def add_commands(groups: Any) -> None:
    reference = groups.add_parser("cpp-replay", aliases=["reference"],
                                  help="the C++ reference replay of dumps through model.pt2",
                                  epilog="example: hstu-replay cpp-replay build")
    commands = reference.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = commands.add_parser("build", help="build the C++ replay program with CMake (cached)",
                                 epilog="example: hstu-replay cpp-replay build --build-dir runs/cpp-replay-build")
    _build_dir_arg(build)
    build.set_defaults(func=_build)

    replay = commands.add_parser(
        "run", help="run every dump batch through the package in C++ and compare with its logits "
                       "(exit 0 all within tolerance, 2 some batch is not)",
        epilog="example: hstu-replay cpp-replay run --repository runs/model_repository --dump-dir runs/dumps")
    source = replay.add_mutually_exclusive_group(required=True)
    REPOSITORY.add_to(source, default=None, help="Triton repository: uses its hstu_gr_ranking/1/model.pt2")
    Option("--package", "an AOTInductor package taking (values, lengths, num_candidates)").add_to(source)
    DUMP_DIR.add_to(replay, help="directory of batch_NNNNNN_*.pt files", required=True, metavar=None)
    TOLERANCE.add_to(replay)
    written = replay.add_mutually_exclusive_group()
    Option("--write-reference", "also write the C++ outputs as batch_NNNNNN_<NAME>.pt into the dump directory",
           metavar="NAME").add_to(written)
    Option("--produce-reference", "write the C++ outputs as batch_NNNNNN_compiled_logits.pt into a dump that has "
                                  "no reference logits yet (nothing is compared)", type=bool).add_to(written)
    Option("--timeout", "seconds for the whole replay", cpp_replay.REPLAY_TIMEOUT_S, float).add_to(replay)
    _build_dir_arg(replay)
    replay.set_defaults(func=_replay)


def _build_dir_arg(parser: argparse.ArgumentParser) -> None:
    Option("--build-dir", f"CMake build directory (default {cpp_replay.DEFAULT_BUILD_DIR})").add_to(parser)


@long_running
def _build(args: argparse.Namespace) -> int:
    print(cpp_replay.build(args.build_dir))
    return 0


@long_running
def _replay(args: argparse.Namespace) -> int:
    if args.repository:
        from hstu_replay.interface import NOCACHE
        from hstu_replay.server.repository import RepositoryLayout

        package = RepositoryLayout(Path(args.repository)).package(NOCACHE)
    else:
        package = Path(args.package)
    if args.produce_reference:
        written = cpp_replay.produce_reference(package, args.dump_dir, build_dir=args.build_dir, timeout=args.timeout)
        print(f"hstu-replay: wrote compiled_logits for {written} batches into {args.dump_dir}")
        return 0
    result = cpp_replay.replay(package, args.dump_dir, args.tolerance, args.write_reference,
                           build_dir=args.build_dir, timeout=args.timeout)
    sys.stdout.write(result.output)
    sys.stdout.flush()
    return result.returncode
