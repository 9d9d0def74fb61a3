"""`hstu-replay options` against the README's option table (written by hand, separately)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hstu_replay.cli import main
from hstu_replay.loadtest.listing import listed_options, shown_default
from hstu_replay.loadtest.options import GROUPS, OPTIONS

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)`[^|]*\| `(LOCUST_[A-Z0-9_]+)` \|([^|]*)\|")


def readme_rows() -> dict[str, tuple[str, str]]:
    """flag -> (env var, default) of the README's "Options" table; a default's remark in
    brackets ('-1 (off)') is dropped."""
    text = README.read_text()
    section = text[text.index("### Options"):]
    section = section[: section.index("\n### ", 1)]
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            default = re.sub(r"\(.*\)", "", m.group(3)).replace("`", "").strip()
            rows[m.group(1)] = (m.group(2), default)
    return rows


def test_the_listing_and_the_readme_table_agree():
    readme = readme_rows()
    listed = {r.flag: (r.env_var, r.default) for r in listed_options()}
    assert len(readme) > 30  # the table was found and read
    assert sorted(set(readme) - set(listed)) == [], "in the README, not in the listing"
    assert sorted(set(listed) - set(readme)) == [], "in the listing, not in the README"
    differ = {flag: (readme[flag], listed[flag]) for flag in readme if not same(readme[flag], listed[flag])}
    assert differ == {}


def same(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Same variable and default ('1.0' and '1' are one number)."""
    try:
        return a[0] == b[0] and float(a[1]) == float(b[1])
    except ValueError:
        return a == b


def test_every_option_is_listed_once_in_its_group_and_groups_come_in_order():
    rows = listed_options()
    assert sorted(r.flag for r in rows) == sorted(["--host", *(o.flag for o in OPTIONS)])
    order = [GROUPS.index(r.group) for r in rows]
    assert order == sorted(order)
    by_flag = {r.flag: r for r in rows}
    assert by_flag["--verify-fraction"].env_var == "LOCUST_VERIFY_FRACTION"
    assert by_flag["--triton-ssl"].default == "off"
    assert by_flag["--stage-seconds"].default == "10"
    assert by_flag["--tolerance"].default == "0.0625"


@pytest.mark.parametrize("value, shown", [(None, ""), ("", ""), (False, "off"), (True, "on"), (30.0, "30"),
                                          (0.0625, "0.0625"), (-1, "-1"), ("0,0.5,1.0", "0,0.5,1.0")])
def test_defaults_are_shown_as_typed(value, shown):
    assert shown_default(value) == shown


def test_the_command_prints_every_group_and_option(capsys):
    assert main(["options"]) == 0
    out = capsys.readouterr().out
    positions = [out.index(f"\n{g}:\n") for g in GROUPS]
    assert positions == sorted(positions)
    for o in OPTIONS:
        assert re.search(rf"^  {re.escape(o.flag)} +{o.env_var} ", out, re.M), o.flag


def test_the_markdown_rows_are_the_readme_layout(capsys):
    assert main(["options", "--format", "markdown", "--group", "cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| option | env | default | meaning |"
    assert {ROW.match(line).group(1) for line in lines[2:]} == {
        "--cache-budget-tokens", "--cache-page-tokens", "--host-budget-tokens", "--offload-mode",
        "--offload-chunk-tokens", "--tier-mix", "--working-set"}


def test_an_unknown_group_is_one_line_and_exit_2(capsys):
    assert main(["options", "--group", "nonesuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--group 'nonesuch'" in err[0]
