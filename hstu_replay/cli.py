"""`hstu-replay` command line: one sub-command group per pipeline stage.

Each group lives in its stage's package as `add_commands(subparsers)`, every command's --help
ending with one line "example: hstu-replay ..." (tests/test_cli.py parses each); handlers import
heavy dependencies (torch) lazily so that the load-generator side never needs them. This is the one
place that turns an `HstuReplayError` into a one-line message and an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hstu_replay import __version__
from hstu_replay.errors import HstuReplayError

#: command group -> module providing `add_commands(subparsers)`
COMMAND_GROUPS: dict[str, str] = {
    "data": "hstu_replay.data.cli",
    "dump": "hstu_replay.dumps.cli",
    "server": "hstu_replay.server.cli",
    "cpp-replay": "hstu_replay.cpp_replay.cli",
    "plan": "hstu_replay.plan.cli",
    "capacity": "hstu_replay.capacity.cli",
    "flow": "hstu_replay.flow.cli",
    "protocol": "hstu_replay.protocol.cli",
    "fleet": "hstu_replay.fleet.cli",
    "options": "hstu_replay.loadtest.listing",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hstu-replay", description=__doc__.splitlines()[0],
                                     epilog="example: hstu-replay options --group target")
    parser.add_argument("--version", action="version", version=f"hstu-replay {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    for name, module in COMMAND_GROUPS.items():
        importlib.import_module(module).add_commands(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HstuReplayError as exc:
        print(f"hstu-replay: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("hstu-replay: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
