"""The generated reference pages equal what the code gives now (regenerate: python docs/gen/reference.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_gen_reference", ROOT / "docs" / "gen" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.mark.parametrize("name", sorted(GEN.PAGES))
def test_the_committed_page_is_what_the_code_generates(name):
    committed = (GEN.REFERENCE / name).read_text()
    assert committed == GEN.PAGES[name](), f"docs/reference/{name} is stale: run {GEN.REGENERATE} and commit it"


def test_every_load_test_option_has_a_row_on_the_options_page():
    from hstu_replay.loadtest.options import OPTIONS

    page = (GEN.REFERENCE / "options.md").read_text()
    missing = [o.flag for o in OPTIONS if f"| `{o.flag}` |" not in page]
    assert not missing, f"options without a row: {missing}; run {GEN.REGENERATE}"


def test_every_command_has_a_section_on_the_commands_page():
    from hstu_replay.cli import COMMAND_GROUPS

    page = (GEN.REFERENCE / "commands.md").read_text()
    missing = [g for g in COMMAND_GROUPS if f"## `hstu-replay {g}`" not in page]
    assert not missing, f"commands without a section: {missing}; run {GEN.REGENERATE}"


def test_the_check_mode_names_a_stale_page(tmp_path, monkeypatch, capsys):
    for name in GEN.PAGES:
        (tmp_path / name).write_text(GEN.PAGES[name]())
    (tmp_path / "options.md").write_text("stale\n")
    monkeypatch.setattr(GEN, "REFERENCE", tmp_path)
    assert GEN.main(["--check"]) == 1
    assert "options.md is stale" in capsys.readouterr().err
