"""Limits and defaults quoted in the docs are the code's."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INTERFACE = DOCS / "reference" / "interface.md"
#: "`--flag` ... (default `value`" or ", default `value`" in a hand-written page: checked against the
#: option table or the command's parser
QUOTED_DEFAULT = re.compile(r"`(--[a-z0-9-]+)(?: [^`]*)?`[^`\n]{0,40}?[(,] ?default:? `([^`]+)`")


def _limits_table() -> dict[str, int]:
    table = INTERFACE.read_text().split("<!-- limits -->", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([\d,]+) \|", table, flags=re.M)
    return {name: int(value.replace(",", "")) for name, value in rows}


def test_the_interface_page_quotes_every_published_limit_as_the_code_has_it():
    from hstu_replay.interface import PUBLISHED_LIMITS

    code = {f.name: getattr(PUBLISHED_LIMITS, f.name) for f in dataclasses.fields(PUBLISHED_LIMITS)}
    assert _limits_table() == code


def test_the_history_cap_quoted_is_the_code_s():
    from hstu_replay.interface import PUBLISHED_LIMITS

    text = INTERFACE.read_text()
    quoted = re.search(r"capped at ([\d,]+) items at batch 8 with 16 candidates", text)
    assert quoted and int(quoted.group(1).replace(",", "")) == PUBLISHED_LIMITS.history_cap(8, 16)


def _command_defaults() -> dict[str, set[str]]:
    """Every flag of every hstu-replay command -> the defaults it has there, as typed."""
    from hstu_replay.cli import build_parser
    from hstu_replay.loadtest.listing import listed_options, shown_default

    found: dict[str, set[str]] = {}
    for row in listed_options():
        found.setdefault(row.flag, set()).add(row.default)

    def walk(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            for flag in action.option_strings:
                found.setdefault(flag, set()).add(shown_default(action.default))

    walk(build_parser())
    return found


def test_every_default_quoted_in_a_page_is_the_code_s():
    defaults = _command_defaults()
    quoted = [(page.relative_to(DOCS), flag, value) for page in DOCS.rglob("*.md")
              for flag, value in QUOTED_DEFAULT.findall(page.read_text())]
    assert len(quoted) >= 10  # the pages do quote defaults this way
    wrong = [(str(page), flag, value, sorted(defaults.get(flag, {"no such option"})))
             for page, flag, value in quoted if value not in defaults.get(flag, set())]
    assert not wrong, wrong


def test_the_interface_page_lists_every_interface_with_its_model_and_tensors():
    from hstu_replay.interface import INTERFACES

    rows = {line.split("`")[1]: line for line in INTERFACE.read_text().splitlines()
            if line.startswith("| `") and line.count("|") == 6}
    assert set(INTERFACES) <= set(rows), set(INTERFACES) - set(rows)
    for name, interface in INTERFACES.items():
        row = rows[name]
        assert f"`{interface.model_name}`" in row, name
        assert all(t.name in row for t in interface.inputs), name
        assert all(t.name in row for t in interface.outputs), name
        assert row.rstrip(" |").endswith("yes" if interface.uses_cache else "no"), name


def test_the_small_model_s_limits_quoted_are_the_code_s():
    """Where the README and the reference-server guide state the built-in model's limits."""
    from hstu_replay.server.model_config import get_config

    small = get_config("small").limits
    sentence = re.compile(r"at most (\d+) users a request, (\d+) history\s+items and (\d+) candidates a\s+user,? "
                          r"\(?([\d,]+) values")
    for page in (ROOT / "README.md", DOCS / "guides" / "reference-server.md"):
        quoted = sentence.search(page.read_text())
        assert quoted, f"{page.name}: the small model's limits are not stated"
        assert (int(quoted[1]), int(quoted[2]), int(quoted[3]), int(quoted[4].replace(",", ""))) == \
               (small.max_batch, small.max_history, small.max_candidates, small.max_values), page.name
