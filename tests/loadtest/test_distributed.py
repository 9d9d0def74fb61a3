"""Locust's own master/worker distribution on loopback against the real target."""

from __future__ import annotations

import re
import signal
import time

import pytest

from hstu_replay.loadtest.records import read_records
from hstu_replay.stats.histogram import LatencyHistogram
from tests.conftest import run_distributed

pytestmark = pytest.mark.integration


def distributed_run(tmp_path, server, store, kill_one_worker: bool = False):
    def kill_second_worker(master_log, workers):
        deadline = time.monotonic() + 90
        while "Shape test starting" not in master_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(7)  # both workers are sending by now (sweep: 12 s)
        workers[1].send_signal(signal.SIGKILL)

    return run_distributed(tmp_path, "--triton-url", server.grpc_url, "--workload", "sessions", "--store", str(store),
                           "--hit-ratios", "0,0.9", "--batch-sizes", "2", "--stage-seconds", "5",
                           "--warmup-seconds", "1", "--max-history", "256", "--max-values", "1000",
                           during=kill_second_worker if kill_one_worker else None)


def test_master_merges_two_workers(triton_server, sample_store, tmp_path):
    import json

    code, report_dir, log = distributed_run(tmp_path, triton_server, sample_store)
    assert code == 0, log[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert report["run"]["workers"] == 2 and report["run"]["role"] == "master"
    # 1000 values over 2 users: (500 - 6 context) / 2 - 16 candidates = 231 items each, below 256
    assert report["run"]["history_caps"] == {"2": 231}
    records = read_records(report_dir)
    by_worker = {r["worker"] for r in records}
    assert by_worker == {0, 1}
    measured = [r for r in records if r["kind"] == "measure" and r["ok"]]
    assert sum(b["requests"] for b in report["bins"]) == len(measured)
    for stage in report["stages"]:
        assert abs(stage["achieved_ratio"] - stage["target_ratio"]) <= 0.02, stage
        assert stage["hit_disagreements"] == 0
    keys = {w: {int(k) for r in records if r["worker"] == w for k in re.findall(r"key (\d+)", r["label"])}
            for w in (0, 1)}
    assert keys[0] and keys[1] and not keys[0] & keys[1]  # no cache key on two workers
    assert_percentiles_are_those_of_the_records(report, measured)


def assert_percentiles_are_those_of_the_records(report: dict, measured: list[dict]) -> None:
    """Each stage's merged figures equal those recomputed from every process's records: the
    histogram of the records' latencies gives the very same p50/p90/p99, mean and max, and each
    lies within 0.1% (plus the half microsecond of rounding) of the exact nearest-rank value."""
    for b in report["bins"]:
        ms = [r["latency_ms"] for r in measured if r["stage"] == b["name"]]
        rebuilt = LatencyHistogram.of_ms(ms)
        assert b["requests"] == len(ms) > 0, b["name"]
        assert (b["mean_ms"], b["max_ms"]) == (rebuilt.mean_ms, rebuilt.max_us / 1e3), b["name"]
        ordered = sorted(ms)
        for q in (50, 90, 99):
            reported = b[f"p{q}_ms"]
            assert reported == rebuilt.percentile_ms(q), (b["name"], q)
            exact = ordered[-(-q * len(ordered) // 100) - 1]  # nearest rank: the ceil(q/100 n)-th
            assert abs(reported - exact) <= exact / 1000 + 0.0005, (b["name"], q, reported, exact)


def test_a_killed_worker_leaves_its_records_and_the_master_carries_on(triton_server, sample_store, tmp_path):
    import json

    code, report_dir, log = distributed_run(tmp_path, triton_server, sample_store, kill_one_worker=True)
    assert (report_dir / "report.json").exists(), log[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert sum(b["requests"] for b in report["bins"]) > 0
    # Locust's master marks exactly the killed worker missing and goes on with the other one
    assert len(re.findall(r"Worker \S+ failed to send heartbeat, setting state to missing", log)) == 1, log[-3000:]
    assert "The last worker went missing" not in log
    killed = [r for r in read_records(report_dir) if r["worker"] == 1]
    assert killed, "the killed worker's finished requests are on disk"
