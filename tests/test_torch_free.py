"""The load generator needs no torch: the whole path a Locust worker or the capacity driver runs
(the locustfile, client, plan, analysis, stats, output, report, loadtest, capacity, fleet, verify, request, the
dumps reader, the data store) imports in a venv that has no torch, and loads none of the target's packages.

The core below the Locust layer (data, plan, analysis, client, stats, report, output and the top-level modules
they share) imports neither locust nor gevent nor torch, not even inside a function: the scan reads the source
(ast), and checks itself on planted imports."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

from tests.fresh_venv import TARGET_ONLY, fresh_venv

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["client", "plan", "analysis", "stats", "output", "report", "loadtest", "capacity", "fleet"]
MODULES = ["hstu_replay.locustfile", "hstu_replay.verify", "hstu_replay.request", "hstu_replay.dumps.reader",
           "hstu_replay.data.store"]

IMPORT_ALL = """
import importlib, json, pkgutil, sys, traceback
import hstu_replay

failed = {}


def load(name):
    try:
        return importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc()


names = list(MODULES)
for package in PACKAGES:
    module = load(f"hstu_replay.{package}")
    if module is not None:
        names += [info.name for info in pkgutil.walk_packages(module.__path__, f"hstu_replay.{package}.")]
for name in names:
    load(name)
loaded = sorted({m.partition(".")[0] for m in sys.modules} & set(TARGET_ONLY))
print(json.dumps({"imported": names, "failed": failed, "loaded": loaded}))
"""


def test_the_load_generator_imports_without_torch(tmp_path):
    python = fresh_venv(tmp_path, ("__editable__", "hstu_replay", *TARGET_ONLY))
    script = f"MODULES = {MODULES!r}\nPACKAGES = {PACKAGES!r}\nTARGET_ONLY = {TARGET_ONLY!r}\n{IMPORT_ALL}"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert "hstu_replay.loadtest.hooks" in result["imported"] and len(result["imported"]) > 40
    assert not result["failed"], "\n".join(result["failed"].values())
    assert result["loaded"] == []


CORE = ("data", "plan", "analysis", "client", "stats", "report", "output", "verify.py", "request.py",
        "interface.py", "errors.py", "cache_ledger.py")
ABOVE_THE_CORE = ("locust", "gevent", "torch")


def layer_violations(path: Path, root: Path = ROOT) -> list[str]:
    """`file:line module` for each import of locust, gevent or torch in `path`, wherever it stands."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if n.split(".")[0] in ABOVE_THE_CORE]
    return found


def core_files() -> list[Path]:
    package = ROOT / "hstu_replay"
    return sorted(p for part in CORE for p in ([package / part] if part.endswith(".py") else
                                               (package / part).rglob("*.py")))


def test_the_core_imports_neither_locust_nor_gevent_nor_torch():
    files = core_files()
    assert len(files) > 60 and ROOT / "hstu_replay" / "plan" / "timeline.py" in files
    found = [v for path in files for v in layer_violations(path)]
    assert not found, "imports above the core:\n" + "\n".join(found)


def test_the_layer_scan_finds_planted_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text((ROOT / "hstu_replay" / "plan" / "timeline.py").read_text()
                      + "\n\ndef later():\n    import gevent\n    from gevent.event import Event\n"
                        "    from locust import events\n    import torch.nn, json\n    from . import gevent_like\n"
                        "    import geventlike\n")
    lines = len((ROOT / "hstu_replay" / "plan" / "timeline.py").read_text().splitlines())
    assert layer_violations(module, tmp_path) == [f"m.py:{lines + 4} gevent", f"m.py:{lines + 5} gevent.event",
                                                  f"m.py:{lines + 6} locust", f"m.py:{lines + 7} torch.nn"]
