"""The natural replay's index (`hstu_replay.natural.PIECES`): every module it names exists, and
every module of the package that reads the replay's own modules is named there."""

from __future__ import annotations

import ast
from pathlib import Path

from hstu_replay.natural import PIECES

ROOT = Path(__file__).resolve().parents[1]
#: the modules that are natural replay and nothing else: whoever imports one takes part in it
OWN = ("hstu_replay.plan.timeline", "hstu_replay.plan.over_limit", "hstu_replay.analysis.store_curve",
       "hstu_replay.report.natural", "hstu_replay.capacity.natural")


def readers(root: Path = ROOT) -> set[str]:
    """Modules of the package that import one of `OWN`, at the top or inside a function."""
    found = set()
    for path in (root / "hstu_replay").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n in OWN for n in names):
                found.add(".".join(path.relative_to(root).with_suffix("").parts))
    return found


def test_every_piece_named_exists():
    missing = [m for m in PIECES if not (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert not missing, missing
    assert set(OWN) <= set(PIECES)


def test_every_module_that_reads_the_replay_is_named():
    found = readers()
    assert {"hstu_replay.plan.workloads", "hstu_replay.loadtest.finish", "hstu_replay.analysis.cli"} <= found
    assert not found - set(PIECES), sorted(found - set(PIECES))


def test_the_reader_scan_sees_both_forms(tmp_path):
    package = tmp_path / "hstu_replay"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from hstu_replay.plan.timeline import build_trace\n")
    (package / "b.py").write_text("import hstu_replay.report.natural\n")
    (package / "c.py").write_text("from hstu_replay.plan.timelines import x\nimport hstu_replay.plan\n")
    assert readers(tmp_path) == {"hstu_replay.a", "hstu_replay.b"}
