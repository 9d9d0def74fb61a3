"""Ctrl-C (SIGINT) ends every mode of a real Locust run against the real server, with the report
written: headless, web UI (a run started from the form), master and worker. The product's
bound is 5 s; the assertions leave room for a loaded machine and the times are printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hstu_replay.loadtest.interrupts import INTERRUPTED_EXIT_CODE
from hstu_replay.loadtest.records import read_records
from tests.conftest import MACHINE_LENIENT, ROOT, free_ports, locust_command
from tests.loadtest.test_webaccess import interrupt
from tests.conftest import wait_until
from tests.loadtest.test_webui import get_json, post_form

pytestmark = pytest.mark.integration

BOUND_S = 15.0  # the product target is 5 s; the measured times are printed (-s)


def sweep(server, dumps: Path) -> list[str]:
    return ["--host", f"grpc://{server.grpc_url}", "--workload", "dumps", "--dump-dir", str(dumps), "--hit-ratios", "0,1.0",
            "--batch-sizes", "1", "--stage-seconds", "60", "--warmup-seconds", "0.5", "--max-history", "256"]


def launch(log: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(locust_command("--loglevel", "INFO", *args), stdout=out, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


def measuring(report: Path, count: int = 5) -> bool:
    return sum(r["kind"] == "measure" for r in read_records(report)) >= count


def assert_report_matches_records(report: Path) -> dict:
    data = json.loads((report / "report.json").read_text())
    measured = [r for r in read_records(report) if r["kind"] == "measure"]
    assert measured
    assert sum(b["requests"] for b in data["bins"]) == len(measured)
    return data


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_ends_a_headless_run_with_its_report(signum, triton_server, reference_dumps, tmp_path):
    report = tmp_path / "report"
    process = launch(tmp_path / "locust.log", "--headless", "-u", "2", "-r", "2", "--report-dir", str(report),
                     *sweep(triton_server, reference_dumps))
    try:
        wait_until(lambda: measuring(report), 90, "measured requests")
    finally:
        took = interrupt(process, signum=signum)
    print(f"headless mid-run: exit {took:.2f} s after {signal.Signals(signum).name} (code {process.returncode})")
    assert process.returncode == INTERRUPTED_EXIT_CODE
    assert took < BOUND_S
    assert_report_matches_records(report)


def web_ui_run_from_the_form(triton_server, reference_dumps, tmp_path):
    """A web UI process with a run started from its form and measuring: (process, its URL, report dir)."""
    (port,) = free_ports(1)
    base, report = f"http://127.0.0.1:{port}", tmp_path / "report"
    process = launch(tmp_path / "locust.log", "--web-port", str(port), "--report-dir", str(report),
                     *sweep(triton_server, reference_dumps))
    try:
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "ready", 60, "the web UI")
        form = {"user_count": 2, "spawn_rate": 2, "host": f"grpc://{triton_server.grpc_url}"}
        assert post_form(f"{base}/swarm", form)["success"]
        wait_until(lambda: measuring(report), 90, "measured requests")
    except BaseException:
        interrupt(process)
        raise
    return process, base, report


def test_ctrl_c_ends_the_web_ui_during_a_run_from_the_form(triton_server, reference_dumps, tmp_path):
    process, _, report = web_ui_run_from_the_form(triton_server, reference_dumps, tmp_path)
    took = interrupt(process)
    print(f"web UI mid-run: exit {took:.2f} s after SIGINT (code {process.returncode})")
    assert took < BOUND_S
    data = assert_report_matches_records(report)
    assert process.returncode == INTERRUPTED_EXIT_CODE and data["interrupted"]["signal"] == "SIGINT"


def test_the_web_ui_stop_button_is_a_normal_end_not_an_interruption(triton_server, reference_dumps, tmp_path):
    process, base, report = web_ui_run_from_the_form(triton_server, reference_dumps, tmp_path)
    try:
        assert post_form(f"{base}/stop", {})["success"]
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "stopped", 30, "the run to stop")
        wait_until(lambda: (report / "report.json").is_file(), 10, "the report")
    finally:
        interrupt(process)  # the web UI idle: no run to interrupt
    data = assert_report_matches_records(report)
    assert data["interrupted"] is None and process.returncode != INTERRUPTED_EXIT_CODE, data.get("interrupted")


def test_ctrl_c_ends_a_worker_and_then_its_master(triton_server, reference_dumps, tmp_path):
    (master_port,) = free_ports(1)
    report = tmp_path / "report"
    master = launch(tmp_path / "master.log", "--master", "--headless", "-u", "4", "-r", "4", "--expect-workers", "2",
                    "--expect-workers-max-wait", "90", "--master-bind-port", str(master_port), "--report-dir", str(report),
                    *sweep(triton_server, reference_dumps))
    workers = [launch(tmp_path / f"worker{i}.log", "--worker", "--master-port", str(master_port), "--report-dir",
                      str(report)) for i in range(2)]
    try:
        wait_until(lambda: measuring(report, 10), 120, "measured requests")
        worker_took = interrupt(workers[0])
        time.sleep(1)
        master_took = interrupt(master)
        began = time.monotonic()
        workers[1].wait(BOUND_S)
        other_took = time.monotonic() - began
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    print(f"worker: exit {worker_took:.2f} s after SIGINT (code {workers[0].returncode}); master: {master_took:.2f} s "
          f"(code {master.returncode}); the other worker {other_took:.2f} s after its master")
    assert worker_took < BOUND_S and master_took < BOUND_S
    data = json.loads((report / "report.json").read_text())
    measured = sum(r["kind"] == "measure" for r in read_records(report))
    print(f"master's report: {sum(b['requests'] for b in data['bins'])} measured requests; workers' records: {measured}")
    assert data["run"]["role"] == "master"
    assert sum(b["requests"] for b in data["bins"]) == measured  # the interrupted worker's last ones included


def test_ctrl_c_ends_a_master_still_waiting_for_its_workers(triton_server, reference_dumps, tmp_path):
    (master_port,) = free_ports(1)
    log = tmp_path / "master.log"
    master = launch(log, "--master", "--headless", "-u", "2", "-r", "2", "--expect-workers", "2",
                    "--master-bind-port", str(master_port), "--report-dir", str(tmp_path / "report"),
                    *sweep(triton_server, reference_dumps))
    worker = launch(tmp_path / "worker.log", "--worker", "--master-port", str(master_port))
    try:
        wait_until(lambda: "1 of 2 connected" in log.read_text() or "Worker" in log.read_text(), 60, "a worker to connect")
        time.sleep(1)
        took = interrupt(master)
        began = time.monotonic()
        worker.wait(BOUND_S)
        worker_took = time.monotonic() - began
    finally:
        for p in (master, worker):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    print(f"master waiting for workers: exit {took:.2f} s after SIGINT (code {master.returncode}); its worker "
          f"{worker_took:.2f} s after")
    assert took < BOUND_S and worker_took < BOUND_S and "Traceback" not in log.read_text()
    assert "hstu-replay: interrupted while waiting for workers" in log.read_text()


# -- an interrupted run says so and never passes ----------------------------------------------------------

STAGES = ("b1_h0.00", "b1_h0.50", "b1_h1.00")
STAGE_S = 4.5  # each stage: 0.5 s of warm-up, 4 s measured


def three_stages(server, dumps: Path) -> list[str]:
    return ["--host", f"grpc://{server.grpc_url}", "--workload", "dumps", "--dump-dir", str(dumps),
            "--hit-ratios", "0,0.5,1.0", "--batch-sizes", "1", "--stage-seconds", "4", "--warmup-seconds", "0.5",
            "--max-history", "256", *MACHINE_LENIENT]


def measuring_in(report: Path, stage: str) -> bool:
    return any(r["kind"] == "measure" and r["stage"] == stage for r in read_records(report))


def assert_interrupted_in_the_second_stage(data: dict, output: str) -> None:
    """report.json's section and flags, and the one terminal line, of a run SIGINTed in the second stage."""
    section = data["interrupted"]
    assert (section["signal"], section["stages_full"], section["stages_partial"], section["stages_not_run"]) == (
        "SIGINT", [STAGES[0]], [STAGES[1]], [STAGES[2]]), section
    assert STAGE_S <= section["at_s"] < 2 * STAGE_S
    flags = {s["name"]: [f["flag"] for f in s["flags"]] for s in data["stages"]}
    assert "interrupted" not in flags[STAGES[0]] and "interrupted" in flags[STAGES[1]] and STAGES[2] not in flags
    assert "interrupted" in next(b for b in data["bins"] if b["name"] == STAGES[1])["flags"]
    lines = [line for line in output.splitlines() if line.startswith("hstu-replay: FAIL: interrupted by SIGINT")]
    assert lines == [f"hstu-replay: FAIL: interrupted by SIGINT at {section['at_s']:.1f} s: stages run fully: "
                     f"{STAGES[0]}; partly: {STAGES[1]}; never started: {STAGES[2]} (exit {INTERRUPTED_EXIT_CODE})"]


@pytest.mark.parametrize("thresholds", [(), ("--max-mismatches", "0")], ids=["no-thresholds", "thresholds"])
def test_sigint_in_the_second_of_three_stages_marks_the_report_interrupted(thresholds, triton_server,
                                                                          reference_dumps, tmp_path):
    report, log = tmp_path / "report", tmp_path / "locust.log"
    process = launch(log, "--headless", "-u", "2", "-r", "2", "--report-dir", str(report),
                     *three_stages(triton_server, reference_dumps), *thresholds)
    try:
        wait_until(lambda: measuring_in(report, STAGES[1]), 90, "measured requests of the second stage")
    finally:
        interrupt(process)
    data = assert_report_matches_records(report)
    output = log.read_text()
    assert process.returncode == INTERRUPTED_EXIT_CODE, output[-3000:]
    assert_interrupted_in_the_second_stage(data, output)
    if thresholds:  # the flag is a violation too, yet the exit code says interrupted, not 3
        assert not data["thresholds"]["passed"]
        assert any(v.startswith(f"stage {STAGES[1]} is interrupted: SIGINT at ")
                   for v in data["thresholds"]["violations"]), data["thresholds"]
    else:
        assert data["thresholds"] is None


def test_sigint_to_the_master_of_a_distributed_run_marks_its_report_interrupted(triton_server, reference_dumps,
                                                                               tmp_path):
    (master_port,) = free_ports(1)
    report, log = tmp_path / "report", tmp_path / "master.log"
    master = launch(log, "--master", "--headless", "-u", "2", "-r", "2", "--expect-workers", "1",
                    "--expect-workers-max-wait", "90", "--master-bind-port", str(master_port), "--report-dir",
                    str(report), *three_stages(triton_server, reference_dumps))
    worker = launch(tmp_path / "worker.log", "--worker", "--master-port", str(master_port), "--report-dir", str(report))
    try:
        wait_until(lambda: measuring_in(report, STAGES[1]), 120, "measured requests of the second stage")
        interrupt(master)
        worker.wait(BOUND_S)
    finally:
        for p in (master, worker):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    data = assert_report_matches_records(report)
    assert data["run"]["role"] == "master" and master.returncode == INTERRUPTED_EXIT_CODE, log.read_text()[-3000:]
    assert_interrupted_in_the_second_stage(data, log.read_text())
