"""A capacity step's child, against stand-ins for Locust (the real one: test_capacity_run's integration
tests): a refused start, a step stopped at its time-out writing its report, sampling while it runs."""

from __future__ import annotations

import json
import sys

import pytest

from hstu_replay.capacity.step_run import StepRun, fresh_dir
from hstu_replay.errors import ServerError

# Runs until SIGTERM, then writes a report of one bin as Locust's finish does, and exits 0.
UNTIL_TERM = """
import json, pathlib, signal, sys, time
def finish(*_):
    pathlib.Path(sys.argv[1], "report.json").write_text(json.dumps({"bins": [{"requests": 5, "p99_ms": 9.5}]}))
    sys.exit(0)
signal.signal(signal.SIGTERM, finish)
print("running", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_step_locust_refused_is_one_line_naming_its_error(tmp_path):
    step_dir = fresh_dir(tmp_path / "s1")
    code = "import sys; print('starting'); print('hstu-replay: error: --hit-ratios 2: above 1'); sys.exit(2)"
    with pytest.raises(ServerError, match=r"^step s1: Locust stopped: hstu-replay: error: --hit-ratios 2: above 1 "
                                          r"\(log: .*locust.log\)$"):
        StepRun("s1", [sys.executable, "-c", code], step_dir, timeout_s=30).measure(1.0)


def test_a_step_past_its_time_out_is_stopped_and_its_report_read(tmp_path):
    step_dir = fresh_dir(tmp_path / "s2")
    sampled = []
    step = StepRun("s2", [sys.executable, "-c", UNTIL_TERM, str(step_dir)], step_dir, timeout_s=3.0,
                   stop_grace_s=10.0, sample=lambda: sampled.append(1))
    measured = step.measure(4.0)
    assert measured.problem == "timed out after 3 s" and measured.returncode == 0
    assert (measured.load, measured.requests, measured.p99_ms) == (4.0, 5, 9.5)
    assert sampled == [1]  # one gauge period (2 s) inside the 3 s
    assert json.loads((step_dir / "report.json").read_text())["bins"][0]["requests"] == 5


def test_a_step_that_ends_without_a_report_says_so(tmp_path):
    step_dir = fresh_dir(tmp_path / "s3")
    code = "import sys; print('Traceback (most recent call last):'); print('KeyError: stage'); sys.exit(1)"
    measured = StepRun("s3", [sys.executable, "-c", code], step_dir, timeout_s=30).measure(1.0)
    assert measured.problem == "Locust exited 1 without a report: KeyError: stage" and measured.returncode == 1
