"""`hstu-replay options` against the documented option table (docs/reference/options.md, generated from it;
tests/docs/test_options_page.py checks that page against Locust's own parser)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hstu_replay.cli import main
from hstu_replay.loadtest.listing import listed_options, shown_default
from hstu_replay.loadtest.options import GROUPS, LOCUST_OWN, OPTIONS, REGISTERED

README = Path(__file__).resolve().parents[2] / "docs" / "reference" / "options.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)`[^|]*\| `(LOCUST_[A-Z0-9_]+)` \|([^|]*)\|")


def readme_rows() -> dict[str, tuple[str, str]]:
    """flag -> (env var, default) of the documented option table; a default's remark in
    brackets ('-1 (off)') is dropped."""
    section = README.read_text()
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
    assert sorted(r.flag for r in rows) == sorted([*(o.flag for o in LOCUST_OWN), *(o.flag for o in REGISTERED)])
    assert {o.flag for o in OPTIONS} <= {o.flag for o in REGISTERED}
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
    for o in REGISTERED:
        assert re.search(rf"^  {re.escape(o.flag)} +{o.env_var} ", out, re.M), o.flag


def test_the_markdown_rows_are_the_readme_layout(capsys):
    assert main(["options", "--format", "markdown", "--group", "cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| option | env | default | meaning |"
    assert {ROW.match(line).group(1) for line in lines[2:]} == {
        "--cache-budget-tokens", "--fleet-budgets", "--cache-page-tokens", "--host-budget-tokens", "--offload-mode",
        "--offload-chunk-tokens", "--tier-mix", "--working-set"}


def test_an_unknown_group_is_one_line_and_exit_2(capsys):
    assert main(["options", "--group", "nonesuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--group 'nonesuch'" in err[0]


# -- the listing against Locust's own parser, built with the locustfile's hook --------------------------------

PARSERS = r"""
import json, sys
from locust.argument_parser import get_parser

PROBES = {int: ("7", 7), float: ("0.25", 0.25)}


def described(parser):
    return {flag: {"dest": a.dest, "default": a.default, "help": a.help, "env_var": getattr(a, "env_var", None),
                   "web": getattr(a, "include_in_web_ui", None), "secret": getattr(a, "is_secret", None)}
            for a in parser._actions for flag in a.option_strings if flag.startswith("--")}


def read_from_environment(parser, flag, env_var):
    # what the option holds when only its environment variable is set, against what was set
    (action,) = (a for a in parser._actions if flag in a.option_strings)
    text, expected = ("true", True) if action.nargs == 0 else PROBES.get(action.type, ("probe-value", "probe-value"))
    return getattr(parser.parse_args([], env_vars={env_var: text}), action.dest), expected


bare = described(get_parser())
import hstu_replay.locustfile  # registers the locustfile's init_command_line_parser hook
parser = get_parser()
rows = json.load(sys.stdin)
print(json.dumps({"bare": bare, "hooked": described(parser),
                  "environment": {r["flag"]: read_from_environment(parser, r["flag"], r["env_var"]) for r in rows}},
                 default=str))
"""


@pytest.fixture(scope="module")
def locust_parsers(tmp_path_factory) -> dict:
    """Locust's parser as Locust builds it, without and with the locustfile's hook (in a child
    process: importing locust monkey-patches the process), and each listed option read back from
    only its listed environment variable."""
    import json
    import os
    import subprocess
    import sys

    rows = [{"flag": r.flag, "env_var": r.env_var} for r in listed_options()]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    result = subprocess.run([sys.executable, "-c", PARSERS], input=json.dumps(rows), capture_output=True, text=True,
                            timeout=120, cwd=tmp_path_factory.mktemp("no-locust-conf"), env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_every_option_our_hook_adds_or_changes_on_locusts_parser_is_listed(locust_parsers):
    bare, hooked = locust_parsers["bare"], locust_parsers["hooked"]
    assert "--headless" in bare and "--store" not in bare  # Locust's own parser, without the hook
    changed = {flag for flag, action in hooked.items() if bare.get(flag) != action}
    listed = {r.flag: r for r in listed_options()}
    assert sorted(changed - set(listed)) == [], "registered on Locust's parser, missing from the listing"
    assert sorted(set(listed) - changed) == [], "listed, but not added or changed by the hook"
    assert {"--web-paths-root", "--web-edit-target", "--web-user", "--web-password"} <= changed


def test_each_listed_option_is_what_locusts_parser_holds(locust_parsers):
    bare, hooked = locust_parsers["bare"], locust_parsers["hooked"]
    for row in listed_options():
        action = hooked[row.flag]
        assert action["env_var"] == row.env_var, row.flag
        assert shown_default(action["default"]) == row.default or (row.flag in bare and action["default"] is None), \
            row.flag
        if row.flag not in bare:  # ours: Locust's web form shows the fields, masks nothing, never gets a secret
            assert (action["web"], action["secret"]) == (row.form == "form", row.form == "secret"), row.flag
    assert hooked["--web-password"]["secret"] and not hooked["--web-password"]["web"]
    assert not hooked["--store"]["web"]  # a path: shown only with --web-paths-root


def test_each_listed_environment_variable_sets_its_option(locust_parsers):
    read = locust_parsers["environment"]
    assert len(read) == len(listed_options())
    assert {flag: got for flag, (got, expected) in read.items() if got != expected} == {}


# -- where a user of the locustfile looks ---------------------------------------------------------------------

@pytest.mark.integration
def test_a_start_names_the_listing_and_locusts_help_cannot(tmp_path):
    import subprocess

    from tests.conftest import ROOT, locust_command

    # refused at once (two different targets), yet the line naming the listing comes first
    started = subprocess.run(locust_command("--headless", "--host", "grpc://127.0.0.1:1", "--triton-url", "127.0.0.1:2",
                                            "--report-dir", str(tmp_path / "report")),
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert started.returncode == 2, started.stderr[-2000:]
    lines = started.stderr.splitlines()
    hint = next(i for i, line in enumerate(lines) if line.endswith(": hstu-replay options"))
    assert hint < next(i for i, line in enumerate(lines) if "hstu-replay: error:" in line)
    # Locust answers --help before it imports the locustfile: none of our options, nothing of ours
    helped = subprocess.run(locust_command("--help"), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert helped.returncode == 0 and "--headless" in helped.stdout
    assert "--hit-ratios" not in helped.stdout and "hstu" not in helped.stdout + helped.stderr
