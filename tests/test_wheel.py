"""hstu-replay as a user gets it: the wheel built from this tree, installed without the network
into a fresh venv outside the checkout, runs a headless sweep of its packaged locustfile and a
capacity step from a folder that is not the checkout (marked integration)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import MACHINE_LENIENT, LocustResult
from tests.fresh_venv import EDITABLE, fresh_venv

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["--workload", "dumps", "--max-history", "256", "--warmup-seconds", "0"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The venv's python, with the wheel of a copy of this tree installed (the tree itself stays clean)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "hstu_replay", source / "hstu_replay", ignore=shutil.ignore_patterns("__pycache__"))
    python = fresh_venv(root, EDITABLE)
    built = subprocess.run([str(python), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-w", str(root / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (root / "dist").glob("hstu_replay-*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "hstu_replay"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert set(tracked) <= packed, sorted(set(tracked) - packed)  # the web UI's script too
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return python


def _run(python: Path, cwd: Path, *command: str, timeout: float = 180.0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONUNBUFFERED": "1"}
    return subprocess.run([*command], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_the_wheel_runs_a_sweep_and_a_capacity_step_outside_the_checkout(installed, triton_server,
                                                                          reference_dumps, tmp_path):
    where = _run(installed, tmp_path, str(installed), "-c", "import hstu_replay; print(hstu_replay.LOCUSTFILE)")
    locustfile = Path(where.stdout.strip())
    assert where.returncode == 0 and locustfile.is_file(), where.stderr[-3000:]
    assert ROOT not in locustfile.parents and installed.parents[1] in locustfile.parents

    sweep = _run(installed, tmp_path, str(installed), "-m", "locust", "-f", str(locustfile), "--headless",
                 "--only-summary", "--loglevel", "WARNING", "--report-dir", "sweep", "-u", "1", "-r", "1",
                 "--triton-url", triton_server.grpc_url, "--dump-dir", str(reference_dumps), *SWEEP,
                 "--hit-ratios", "0,1.0", "--batch-sizes", "4", "--stage-seconds", "2", "--max-mismatches", "0",
                 *MACHINE_LENIENT)
    assert (tmp_path / "sweep" / "report.json").is_file(), sweep.stderr[-3000:]
    result = LocustResult(sweep.returncode, sweep.stdout, sweep.stderr, tmp_path / "sweep")
    assert result.violations_but_the_machines() == []
    report = result.report
    assert report["verification"]["verified"] > 0 and report["verification"]["mismatches"] == 0
    assert len(report["stages"]) == 2 and report["stages"][-1]["achieved_ratio"] > 0.9

    capacity = _run(installed, tmp_path, str(installed.parent / "hstu-replay"), "capacity", "run",
                    "--triton-url", triton_server.grpc_url, "--dump-dir", str(reference_dumps), *SWEEP,
                    "--hit-ratios", "0", "--users-steps", "1", "--slo-p99-ms", "60000", "--step-seconds", "3",
                    "--step-timeout", "60", "--out", "capacity")
    assert capacity.returncode == 0, capacity.stdout[-3000:] + capacity.stderr[-3000:]
    (ratio,) = json.loads((tmp_path / "capacity" / "capacity.json").read_text())["ratios"]
    (step,) = ratio["steps"]
    assert step["passed"] and step["requests"] > 0
