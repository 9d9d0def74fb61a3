"""A name with a leading underscore stays inside its module: no `from X import _name` and no
`module._name` on an imported project module, anywhere in the package, the tests, the
benchmarks or the locustfiles."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hstu_replay", "tests", "bench", "locustfiles")
PROJECT = {"hstu_replay", "tests", "bench", "locustfiles"}


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def dotted(node: ast.expr) -> str | None:
    """`a.b.c` of a chain of attributes on a name; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def violations(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line what` for each private name of another project module used in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    found, modules = [], set()  # names bound to project modules (or their members) by imports
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] not in PROJECT:
                continue
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{where}:{node.lineno} from {'.' * node.level}{node.module or ''} import {alias.name}")
                modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = dotted(node.value)
            if base is not None and base.split(".")[0] in modules:
                found.append(f"{where}:{node.lineno} {base}.{node.attr}")
    return found


def project_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_no_private_name_crosses_a_module_border():
    found = [v for path in project_files() for v in violations(path)]
    assert not found, "private names used from another module:\n" + "\n".join(found)


def test_the_check_sees_both_forms(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from hstu_replay.capacity.driver import _stop, fresh_dir\nimport hstu_replay.server.watchdog as w\n"
                      "import json\nw._stat(1)\nw.proc_stat(1)\njson._default_decoder\nw.__name__\n")
    assert violations(module, tmp_path) == ["m.py:1 from hstu_replay.capacity.driver import _stop", "m.py:4 w._stat"]
