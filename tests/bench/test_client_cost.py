"""bench.client_cost's cases and its perf_analyzer traces of each workload."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import client_cost, harness
from bench.harness import Shape
from hstu_replay.interface import KVCACHE, Limits
from hstu_replay.plan.workloads import WorkloadOptions

ROOT = Path(__file__).resolve().parents[2]
SHAPE = Shape(4, 64, 16)


def test_cases_are_named_and_an_unknown_one_exits_2_before_any_load():
    assert client_cost.parse_cases("sessions 0, dumps verified") == ["sessions 0", "dumps verified"]
    with pytest.raises(ValueError, match="'nope'"):
        client_cost.parse_cases("dumps,nope")
    done = subprocess.run([sys.executable, "-m", "bench.client_cost", "--cases", "nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--cases 'nope'" in done.stderr


@pytest.mark.parametrize("case, expected", [
    ("dumps", ["--workload", "dumps", "--dump-dir", "D", "--hit-ratios", "0"]),
    ("sessions 0.5", ["--workload", "sessions", "--store", "S", "--max-history", "64", "--candidates", "16",
                      "--hit-ratios", "0.5"]),
    ("timeline", ["--workload", "timeline", "--store", "S", "--max-history", "64", "--candidates", "16",
                  "--time-slice-ms", "600000"]),
])
def test_each_case_runs_its_workload_at_the_shape(case, expected):
    assert client_cost.data_arguments(client_cost.CASES[case], SHAPE, Path("D"), Path("S")) == expected


def test_a_sessions_trace_is_what_the_planner_sends_primes_included(long_store, tmp_path):
    options = WorkloadOptions(str(long_store), SHAPE.candidates, Limits(max_history=64, max_values=SHAPE.values))
    path = harness.workload_trace("sessions", options, 0.5, SHAPE.batch, 20, KVCACHE, tmp_path / "t.json")
    entries = json.loads(path.read_text())["data"]
    # at 0.5 a fresh key is primed before its first request: more entries than measured requests
    assert len(entries) > 20
    values = KVCACHE.field_to_input["values"]
    lengths = KVCACHE.field_to_input["lengths"]
    for entry in entries:  # every entry is a well-formed batch of its own lengths (checked by hand here)
        n = np.asarray(entry[lengths]["content"])
        assert sum(n) == len(entry[values]["content"]) == entry[values]["shape"][0]
        assert len(n) == 8 * len(entry[KVCACHE.field_to_input["num_candidates"]]["content"])

