"""The load generator needs no torch: the whole path a Locust worker or the capacity driver runs
(the locustfile, client, plan, stats, output, report, loadtest, capacity, fleet, verify, request, the dumps reader,
the data store) imports in a venv that has no torch, and loads none of the target's packages."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.fresh_venv import TARGET_ONLY, fresh_venv

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["client", "plan", "stats", "output", "report", "loadtest", "capacity", "fleet"]
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
