"""bench.scale_out's arithmetic, by hand: what flags a row INVALID, the scale-out verdict, the planner columns."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from bench.scale_out import ScaleResult, Thresholds, limits, planned, scaling, verdict

ROOT = Path(__file__).resolve().parents[2]


def result(workers: int, rps: float, offered: float = 0.0, worker_cores: float = 0.3, peak: float = 0.3,
           host: float = 1.0) -> ScaleResult:
    return ScaleResult(workers, 4 * workers, offered, rps, worker_cores, peak, 1e3 * worker_cores / rps, 0.01,
                       10.0, host, True, 1000)


ONE = result(1, 600.0, offered=600.0)


def test_a_run_inside_every_limit_is_valid():
    # 2,400 offered against a 4,000 ceiling is 60% (< 80%); 10 of 16 host cores (< 90%); 0.5 of a core (< 90%)
    r = result(4, 2390.0, offered=2400.0, worker_cores=2.0, peak=0.5, host=10.0)
    assert limits(r, 4000.0, 16, Thresholds()) == []
    assert scaling(r, ONE) == 2390 / 2400
    assert verdict(r, ONE, []).startswith("met (1.00")


def test_each_limit_flags_the_row_and_names_itself():
    t = Thresholds()
    server = limits(result(2, 1200.0, offered=1200.0), 1400.0, 16, t)  # 1,200 > 0.8 x 1,400 = 1,120
    assert len(server) == 1 and server[0].startswith("server (offered 1,200 req/s > 80% of its ceiling 1,400")
    host = limits(result(2, 1200.0, offered=1200.0, host=1.85), 10_000.0, 2, t)  # 1.85 > 0.9 x 2 = 1.8
    assert host == ["host cores (1.85 of 2 busy)"]
    worker = limits(result(2, 1200.0, offered=1200.0, peak=0.95), 10_000.0, 16, t)
    assert worker == ["worker CPU (0.95 of a core)"]
    # at the thresholds exactly, not yet
    assert limits(result(2, 1200.0, offered=1120.0, host=14.4, peak=0.9), 1400.0, 16, t) == []
    everything = limits(result(2, 1200.0, offered=1200.0, host=1.9, peak=0.95), 1000.0, 2, t)
    assert [f.split(" (")[0] for f in everything] == ["server", "host cores", "worker CPU"]
    assert verdict(result(2, 1200.0), ONE, everything).startswith("INVALID: server (")


def test_scale_out_met_at_ninety_percent_and_missed_below():
    assert verdict(result(2, 1080.0), ONE, []) == "met (0.90 of N x one worker)"  # 1,080 / (2 x 600)
    assert verdict(result(2, 1070.0), ONE, []) == "MISSED (0.89 of N x one worker)"
    assert verdict(result(8, 4800.0), ONE, []) == "met (1.00 of N x one worker)"


def test_a_rate_not_kept_is_missed_even_where_one_worker_did_no_better():
    # one worker offered 600 and carried 500: N x one worker holds for two at 1,000, the schedule does not
    one = result(1, 500.0, offered=600.0)
    assert verdict(one, one, []) == "MISSED (answered 0.83 of the rate offered)"
    assert verdict(result(2, 1000.0, offered=1200.0), one, []).startswith("MISSED (answered 0.83")
    assert verdict(result(2, 1080.0, offered=1200.0), ONE, []) == "met (0.90 of N x one worker)"


def test_a_ceiling_run_is_judged_without_a_ceiling():
    assert limits(result(8, 9000.0), math.inf, 16, Thresholds()) == []


def test_the_planner_columns_by_hand():
    one = ScaleResult(1, 4, 0.0, 500.0, 0.30, 0.30, 0.6, 0.01, 20.0, 1.0, True, 1000)
    # 2,000 req/s at the single worker's 0.6 ms is 1.2 cores: 1.2 / 0.7 -> 2 workers; this run's own
    # 1.5 worker cores / 0.7 -> 3
    four = ScaleResult(4, 16, 2000.0, 2000.0, 1.5, 0.4, 0.75, 0.02, 10.0, 3.0, True, 4000)
    assert planned(four, one) == (2, 3)
    assert planned(one, one) == (1, 1)


def test_bad_worker_counts_exit_2_before_any_load():
    for bad in (["--workers", "2,4"], ["--workers", "1,x"], ["--workers", "0"], ["--rate-per-worker", "0"],
                ["--ceiling-workers", "-1"]):
        done = subprocess.run([sys.executable, "-m", "bench.scale_out", *bad], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and bad[0] in done.stderr and done.stderr.count("\n") == 1, bad
