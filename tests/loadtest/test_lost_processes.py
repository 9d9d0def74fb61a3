"""A distributed run that loses a process, with real processes against the oracle server.

The oracle logs every request with its arrival time, and a request's cache keys say which worker
sent it (plan.keys): so when each worker stopped sending is read from the server's side.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hstu_replay.loadtest.faults import CHECK_INTERVAL_S, LOST_EXIT_CODE, RESUME_GRACE_S
from hstu_replay.loadtest.records import read_records
from hstu_replay.plan.keys import key_owner
from tests.conftest import ROOT, free_ports, locust_command, run_distributed

pytestmark = pytest.mark.integration

MASTER_TIMEOUT_S = 2.0


def sweep_args(oracle, store: Path, stage_seconds: float = 4) -> list[str]:
    return ["--triton-url", oracle.grpc_url, "--workload", "sessions", "--store", str(store), "--hit-ratios", "0,0.9",
            "--batch-sizes", "2", "--stage-seconds", str(stage_seconds), "--warmup-seconds", "0.5",
            "--max-history", "256", "--verify-fraction", "0"]


def last_request_by_worker(seen: list[dict], keys: dict[int, set[int]]) -> dict[int, float]:
    """Wall time of the last request the oracle saw from each worker (keys: worker -> its cache keys)."""
    last: dict[int, float] = {}
    for r in seen:
        for w, own in keys.items():
            if own & set(r["keys"]):
                last[w] = max(last.get(w, 0.0), r["t"])
    return last


def keys_by_worker(seen: list[dict], run_keys: set[int]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for r in seen:
        for k in r["keys"]:
            if k in run_keys:
                out.setdefault(key_owner(k)[0], set()).add(k)
    return out


def run_keys(report_dir: Path) -> set[int]:
    """The cache keys this run's records name (the oracle is shared with other tests)."""
    import re

    return {int(k) for r in read_records(report_dir) for k in re.findall(r"key (\d+)", r["label"])}


def index_of(report_dir: Path, process: subprocess.Popen) -> int:
    """A worker process's index (Locust numbers workers as they connect): its records file says it."""
    (path,) = report_dir.glob(f"records-worker*-*-{process.pid}.jsonl")
    return int(path.name.split("-")[1].removeprefix("worker"))


def wait_for(log: Path, text: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in {log}: {log.read_text()[-2000:]}"
        time.sleep(0.2)


def once_running(seconds: float, act: Callable[[list[subprocess.Popen]], None]):
    """A `during` for run_distributed: `act(workers)` `seconds` after the master started the test."""

    def during(master_log: Path, workers: list[subprocess.Popen]) -> None:
        wait_for(master_log, "Shape test starting")
        time.sleep(seconds)
        act(workers)

    return during


def test_a_killed_worker_is_named_and_fails_the_threshold(oracle_servers, sample_store, tmp_path):
    oracle = oracle_servers(cached_tokens=True)
    start = len(oracle.records())
    killed_at, killed = [], []

    def kill_second_worker(workers):
        workers[1].send_signal(signal.SIGKILL)
        killed_at.append(time.time())
        killed.append(workers[1])

    # 3 s in: inside the first stage's measured window (0.5 s warm-up + 4 s)
    code, report_dir, log = run_distributed(tmp_path, *sweep_args(oracle, sample_store), "--max-workers-lost", "0",
                                            during=once_running(3, kill_second_worker))
    assert code == 3, log[-3000:]  # the threshold: more workers lost than allowed
    report = json.loads((report_dir / "report.json").read_text())
    (lost,) = report["workers_lost"]
    index = index_of(report_dir, killed[0])
    assert lost["index"] == index and lost["users"] == 2, lost
    assert (lost["users_before"], lost["users_after"]) == (4, 2)
    first, second = (s["name"] for s in report["stages"])
    assert lost["stage"] == first and lost["stages"] == [first, second], lost
    # the master last heard from it before the kill (a heartbeat a second; a loaded machine delays one)
    killed_s = killed_at[0] - report["run"]["started"]
    assert killed_s - 2.5 <= lost["lost_at_s"] <= killed_s + 0.5, (lost, killed_s)
    records = [r for r in read_records(report_dir) if r["worker"] == index and r["kind"] == "measure" and r["ok"]]
    assert lost["measured_sent"] == len(records) and lost["measured_received"] <= len(records), lost
    assert lost["measured_unreceived"] == len(records) - lost["measured_received"]
    for stage in report["stages"]:
        assert [f for f in stage["flags"] if f["flag"] == "worker-lost"], stage
    assert report["thresholds"]["violations"][-1] == "1 workers lost > 0 allowed"
    assert report["run"]["workers"] == 2 and report["run"]["workers_end"] == 1
    assert f"worker {index} ({lost['client_id']}) lost at" in log  # the terminal summary
    assert "Workers lost or joined" in (report_dir / "report.html").read_text()
    # after the kill the server saw from the killed worker at most what was in flight then (a request
    # a user), and the other worker went on
    seen = oracle.records()[start:]
    own = keys_by_worker(seen, run_keys(report_dir))
    late = [r["t"] - killed_at[0] for r in seen if own[index] & set(r["keys"]) and r["t"] > killed_at[0]]
    assert len(late) <= lost["users"] and all(t < 5 for t in late), late
    assert last_request_by_worker(seen, own)[1 - index] > killed_at[0] + 3


def start_distributed(tmp_path: Path, args: list[str], workers: int = 2) -> tuple[subprocess.Popen, list, Path]:
    (port,) = free_ports(1)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    common = ["--loglevel", "INFO", "--report-dir", str(tmp_path / "report")]

    def start(command: list[str], log: Path) -> subprocess.Popen:
        with log.open("w") as out:
            return subprocess.Popen(locust_command(*command), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    master = start(["--master", "--headless", "--only-summary", "--expect-workers", str(workers),
                    "--expect-workers-max-wait", "90", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                    str(port), "-u", "4", "-r", "4", *args, *common], tmp_path / "master.log")
    started = [start(["--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *common],
                     tmp_path / f"worker{i}.log") for i in range(workers)]
    return master, started, tmp_path / "report"


def test_workers_of_a_killed_master_stop_within_the_timeout(oracle_servers, sample_store, tmp_path):
    oracle = oracle_servers(cached_tokens=True)
    start = len(oracle.records())
    master, workers, report_dir = start_distributed(
        tmp_path, [*sweep_args(oracle, sample_store, stage_seconds=20), "--master-timeout", str(MASTER_TIMEOUT_S)])
    try:
        wait_for(tmp_path / "master.log", "Shape test starting")
        deadline = time.monotonic() + 60
        while len([p for p in report_dir.glob("records-worker*.jsonl") if p.stat().st_size]) < 2:
            assert time.monotonic() < deadline, "the workers never sent"
            time.sleep(0.2)
        time.sleep(2)
        master.send_signal(signal.SIGKILL)
        killed_at = time.time()
        codes = [w.wait(MASTER_TIMEOUT_S + 20) for w in workers]
    finally:
        for p in [master, *workers]:
            if p.poll() is None:
                p.kill()
    assert codes == [LOST_EXIT_CODE] * 2, codes
    for i in range(2):
        text = (tmp_path / f"worker{i}.log").read_text()
        assert text.count("no heartbeat from the master") == 1 and "records kept in" in text, text[-2000:]
    seen = oracle.records()[start:]
    last = last_request_by_worker(seen, keys_by_worker(seen, run_keys(report_dir)))
    stops = {w: t - killed_at for w, t in last.items()}
    print(f"\n== last request after the master's kill, s: {stops}")
    # the watch's bound: the timeout and a check, or the grace after a stall of the worker's own loop
    # (a loaded machine); half a second for the request in flight
    bound = MASTER_TIMEOUT_S + CHECK_INTERVAL_S + RESUME_GRACE_S + 0.5
    assert set(stops) == {0, 1} and all(s <= bound for s in stops.values()), stops
    kept = read_records(report_dir)
    assert {r["worker"] for r in kept if r["kind"] == "measure"} == {0, 1}  # records kept by both


def test_a_stopped_worker_is_reported_lost(oracle_servers, sample_store, tmp_path):
    oracle = oracle_servers(cached_tokens=True)
    stopped = []

    def pause_second_worker(workers):
        workers[1].send_signal(signal.SIGSTOP)  # its network, as the master sees it, is cut
        stopped.append(workers[1])
        wait_for(tmp_path / "master.log", "failed to send heartbeat, setting state to missing", timeout=15)
        time.sleep(1)
        workers[1].send_signal(signal.SIGCONT)

    try:
        code, report_dir, log = run_distributed(tmp_path, *sweep_args(oracle, sample_store), "--master-timeout",
                                                str(MASTER_TIMEOUT_S), during=once_running(2, pause_second_worker))
    finally:
        for p in stopped:
            p.send_signal(signal.SIGCONT)
    assert code == 0, log[-3000:]  # no threshold set: said, flagged, not failed
    report = json.loads((report_dir / "report.json").read_text())
    (lost,) = report["workers_lost"]
    assert lost["index"] == index_of(report_dir, stopped[0]) and lost["users"] == 2, lost
    assert lost["measured_sent"] is not None, lost
    assert all("worker-lost" in b["flags"] for b in report["bins"])
    worker_log = (tmp_path / "worker1.log").read_text()
    assert "no heartbeat from the master" in worker_log, worker_log[-2000:]  # it stopped itself once resumed


def test_a_master_that_loses_every_worker_ends_with_its_report(oracle_servers, sample_store, tmp_path):
    oracle = oracle_servers(cached_tokens=True)
    ended = []

    def kill_both_workers(workers):
        for w in workers:
            w.send_signal(signal.SIGKILL)
        ended.append(time.monotonic())

    code, report_dir, log = run_distributed(tmp_path, *sweep_args(oracle, sample_store, stage_seconds=20),
                                            during=once_running(3, kill_both_workers))
    waited = time.monotonic() - ended[0]
    print(f"\n== the master ended {waited:.1f} s after losing its last worker")
    assert code == LOST_EXIT_CODE, log[-3000:]
    assert waited < 15  # not the sweep's 41 s
    report = json.loads((report_dir / "report.json").read_text())
    assert len(report["workers_lost"]) == 2 and report["run"]["workers_end"] == 0
    assert "every worker was lost" in log
