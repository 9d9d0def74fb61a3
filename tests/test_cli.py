"""Every `hstu-replay` command's --help ends with an example line, and the example parses."""

from __future__ import annotations

import argparse
import shlex

import pytest

from hstu_replay.cli import build_parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(words after hstu-replay, parser) for the top level and every group and command below it,
    walked through argparse's own sub-parser actions (an alias is the same parser: listed once)."""
    yield path, parser
    seen = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield from commands(child, (*path, name))


ALL = list(commands(build_parser()))


def test_the_walk_finds_every_group_and_command():
    names = {" ".join(path) for path, _ in ALL}
    assert {"", "options", "data", "data synth", "server serve", "capacity natural", "protocol run"} <= names
    assert len(names) > 25


@pytest.mark.parametrize("path, parser", ALL, ids=[" ".join(path) or "hstu-replay" for path, _ in ALL])
def test_every_help_ends_with_an_example_that_parses(path, parser):
    shown = parser.format_help()
    assert "\nexample: hstu-replay " in shown, f"no example line in the --help of hstu-replay {' '.join(path)}"
    assert (parser.epilog or "").startswith("example: hstu-replay ")
    words = shlex.split(parser.epilog.removeprefix("example: "))
    assert words[0] == "hstu-replay" and tuple(words[1:1 + len(path)]) == path, words  # this command's own example
    try:
        args = build_parser().parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"{parser.epilog!r} does not parse (exit {exc.code})")
    assert callable(getattr(args, "func", None))  # it names a command that runs
