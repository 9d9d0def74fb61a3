"""`hstu-replay flow l0` end to end: real export, C++ reference, real tritonserver, real client.

Teardown is checked from outside the flow: every process the summary says the server had must be
gone (same pid and start time) and every port free.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.cli import main
from hstu_replay.dumps.archive import read_tensor_file
from hstu_replay.dumps.reader import read_dump
from hstu_replay.flow.l0 import MARKER, hit_warnings
import hstu_replay.cpp_replay.replay as cpp_replay
from hstu_replay.process import free_ports, port_free
from tests.conftest import sigint_as_in_a_terminal
from tests.kernel import running  # the kernel's view, not the teardown's psutil

ROOT = Path(__file__).resolve().parents[2]
FLOW = [sys.executable, "-m", "hstu_replay.cli", "flow", "l0"]
SAME_PACKAGE_TOLERANCE = 1e-4  # C++ and Python runs of one CPU fp32 package agree this closely


def _flow(*args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLOW, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def assert_torn_down(summary: dict, ports: list[int]) -> None:
    """The server's processes are gone and its ports free, as seen from here."""
    pids = summary["teardown"]["processes"]
    assert summary["server"]["pid"] in pids and len(pids) >= 3  # serve, tritonserver, watchdog at least
    assert [pid for pid in pids if running(pid)] == []  # (a reused pid would show here too)
    assert [port for port in ports if not port_free(port)] == []
    assert summary["teardown"]["clean"] is True and summary["teardown"]["left"] == []


@pytest.mark.integration
def test_flow_l0_end_to_end_on_the_small_config(tmp_path, compiled_repository):
    out = tmp_path / "l0"
    result = _flow("--out", str(out), "--config", "small", "--device", "cpu")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hstu-replay flow l0: PASS small: 15 responses")

    summary = _summary(out)
    assert summary["status"] == "pass" and summary["failed_step"] is None
    assert list(summary["steps"]) == ["build", "export", "data", "dump", "reference", "serve", "client", "teardown"]
    assert_torn_down(summary, list(summary["server"]["ports"].values()))

    # Artifacts: the torch_aoti repository, the dump, the logs, the records, the marker.
    for model in ("hstu_gr_ranking", "hstu_gr_ranking_kvcache"):
        assert 'platform: "torch_aoti"' in (out / "model_repository" / model / "config.pbtxt").read_text()
        assert (out / "model_repository" / model / "1" / "model.pt2").stat().st_size > 0
    assert "hstu-replay: serving" in (out / "logs" / "server.log").read_text()
    assert (out / MARKER).is_file()

    # The reference logits were written by the C++ program (its archives hold a module saved from C++,
    # the Python writer's name a Python class) and are right: the same package run from Python agrees.
    batches = read_dump(out / "dump")
    assert len(batches) == 8
    for batch in batches:
        with zipfile.ZipFile(out / "dump" / f"{batch.name}_compiled_logits.pt") as archive:
            names = archive.namelist()
        assert any(n.endswith("/code/__torch__.py") for n in names), names
        assert not any("hstu_replay" in n for n in names), names
    from hstu_replay.request import RequestTensors
    from hstu_replay.server.build import load_engines

    uncached = load_engines(compiled_repository, None, 32, "cpu").uncached  # a separate export, same seed
    for batch in batches:
        t = batch.tensors
        python = uncached.infer(RequestTensors.of(t["values"], t["lengths"], t["num_candidates"], t["user_ids"],
                                                  t["total_history_lengths"])).logits
        assert np.abs(python - batch.logits).max() <= SAME_PACKAGE_TOLERANCE

    # Every response was compared: the warm-up once, batches 1..7 cold then cached.
    records = [json.loads(line) for line in (out / "client.jsonl").read_text().splitlines()]
    assert [(r["batch"], r["phase"]) for r in records] == [("batch_000000", "warmup")] + [
        (f"batch_{i:06d}", phase) for phase in ("cold", "cached") for i in range(1, 8)]
    assert all(r["ok"] and r["max_abs_diff"] <= SAME_PACKAGE_TOLERANCE and not r["error"] for r in records)
    # The server's own word on hits: nothing cached in pass 1, every history token in pass 2.
    for r in records:
        assert r["cached_tokens"] == (r["history_tokens"] if r["phase"] == "cached" else 0)
    assert summary["warnings"] == [] and "WARNING" not in lines[0]
    cold, cached = summary["client"]["passes"]
    assert (cold["phase"], cold["requests"], cold["verified"], cold["mismatches"], cold["hit_ratio"]) == \
        ("cold", 7, 7, 0, 0.0)
    assert (cached["phase"], cached["requests"], cached["verified"], cached["mismatches"], cached["hit_ratio"]) == \
        ("cached", 7, 7, 0, 1.0)


@pytest.mark.integration
def test_flow_l0_through_the_cpp_backend(tmp_path, compiled_repository):
    """The same flow with tritonserver loading our C++ backend: every answer within the tolerance of
    the C++ reference, the server's hits as each pass names them, the process free of Python."""
    out = tmp_path / "l0"
    result = _flow("--out", str(out), "--export-from", str(compiled_repository), "--device", "cpu",
                   "--frontend", "cpp-backend")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    summary = _summary(out)
    assert summary["status"] == "pass" and summary["options"]["frontend"] == "cpp-backend"
    assert_torn_down(summary, list(summary["server"]["ports"].values()))
    assert "C++ backend models" in (out / "logs" / "server.log").read_text()
    records = [json.loads(line) for line in (out / "client.jsonl").read_text().splitlines()]
    assert len(records) == 15 and all(r["ok"] and not r["error"] for r in records)
    for r in records:
        assert r["cached_tokens"] == (r["history_tokens"] if r["phase"] == "cached" else 0)


@pytest.mark.integration
def test_a_wrong_reference_fails_the_flow_naming_the_case_and_a_rerun_starts_clean(
        tmp_path, compiled_repository, monkeypatch, capsys):
    """The client is made to fail: after the C++ program writes the reference, one batch's logits
    are shifted by 1.0, so both passes must report that batch, and only it."""
    out = tmp_path / "l0"
    (out / "dump").mkdir(parents=True)
    (out / MARKER).write_text("a previous run\n")
    (out / "dump" / "batch_000099_values.pt").write_text("stale")  # a previous run's leftover
    (out / "notes.txt").write_text("not the flow's")
    produce = cpp_replay.produce_reference

    def produce_then_corrupt(package, dump_dir, **kwargs):
        written = produce(package, dump_dir, **kwargs)
        path = Path(dump_dir) / "batch_000003_compiled_logits.pt"
        from hstu_replay.dumps.writer import write_tensor_file

        write_tensor_file(path, read_tensor_file(path) + np.float32(1.0))
        return written

    monkeypatch.setattr(cpp_replay, "produce_reference", produce_then_corrupt)
    code = main(["flow", "l0", "--out", str(out), "--export-from", str(compiled_repository), "--device", "cpu",
                 "--pause", "0"])
    line = capsys.readouterr().out.strip()
    assert code == 1, line
    assert line.startswith("hstu-replay flow l0: FAIL at client: batch_000003 (cold): max |diff| 1 at user ")
    assert "(+1 more)" in line and "teardown clean" in line

    summary = _summary(out)
    assert summary["status"] == "fail" and summary["failed_step"] == "client"
    assert [f.split(":")[0] for f in summary["client"]["failed"]] == ["batch_000003 (cold)", "batch_000003 (cached)"]
    assert [p["mismatches"] for p in summary["client"]["passes"]] == [1, 1]
    assert [p["verified"] for p in summary["client"]["passes"]] == [7, 7]
    assert_torn_down(summary, list(summary["server"]["ports"].values()))
    # The rerun replaced the flow's own entries and left the rest alone.
    assert not (out / "dump" / "batch_000099_values.pt").exists()
    assert (out / "notes.txt").read_text() == "not the flow's"


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["port taken", "broken package"])
def test_a_server_that_cannot_start_fails_at_once_with_its_own_error(tmp_path, compiled_repository, fault):
    repository = compiled_repository
    ports = free_ports(4)
    holder = socket.socket()
    if fault == "port taken":
        holder.bind(("127.0.0.1", ports[0]))
        holder.listen()
        expected = f"hstu-replay: error: http port {ports[0]} on 127.0.0.1 is taken"
    else:
        import shutil

        repository = tmp_path / "broken"
        shutil.copytree(compiled_repository, repository)
        package = repository / "hstu_gr_ranking_kvcache" / "1" / "model.pt2"
        package.write_bytes(package.read_bytes()[:1000])
        expected = "hstu_gr_ranking_kvcache/1/model.pt2: cannot load the AOTInductor package"
    out = tmp_path / "l0"
    try:
        started = time.monotonic()
        result = _flow("--out", str(out), "--export-from", str(repository), "--device", "cpu",
                       "--ports", ",".join(map(str, ports)), "--ready-timeout", "400")
        seconds = time.monotonic() - started
    finally:
        holder.close()
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    line = result.stdout.strip()
    assert len(result.stdout.splitlines()) == 1
    assert line.startswith("hstu-replay flow l0: FAIL at serve: the server exited (exit ")
    assert expected in line and f"(log: {out / 'logs' / 'server.log'})" in line and "teardown clean" in line
    assert "not ready" not in line and seconds < 200  # surfaced as itself, long before the time-out
    summary = _summary(out)
    assert summary["status"] == "fail" and summary["failed_step"] == "serve" and "client" not in summary["steps"]
    assert expected in (out / "logs" / "server.log").read_text()
    own = ports[1:] if fault == "port taken" else ports
    assert summary["teardown"]["ports"] == own
    assert [pid for pid in summary["teardown"]["processes"] if running(pid)] == []
    assert [port for port in ports if not port_free(port)] == []


@pytest.mark.integration
@pytest.mark.parametrize("moment", ["serve", "client"])
def test_ctrl_c_tears_the_server_down(tmp_path, compiled_repository, moment):
    """Interrupted while the server starts (its log has just appeared) or in the pause after the
    warm-up answered."""
    out = tmp_path / "l0"
    flow = subprocess.Popen([*FLOW, "--out", str(out), "--export-from", str(compiled_repository), "--device", "cpu",
                             "--pause", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=sigint_as_in_a_terminal)
    watched = out / ("logs/server.log" if moment == "serve" else "client.jsonl")
    try:
        deadline = time.monotonic() + 300
        while not (watched.is_file() and (moment == "serve" or watched.read_text().count("\n") == 1)):
            assert flow.poll() is None and time.monotonic() < deadline, flow.communicate()
            time.sleep(0.05)
        flow.send_signal(signal.SIGINT)
        stdout, stderr = flow.communicate(timeout=120)
    finally:
        if flow.poll() is None:
            flow.kill()
    assert flow.returncode == 130 and stderr.strip().endswith("hstu-replay: interrupted"), stderr[-2000:]
    summary = _summary(out)
    assert summary["status"] == "interrupted" and summary["failed_step"] == moment
    if moment == "serve":
        assert "ready_seconds" not in summary["server"]
    pids = summary["teardown"]["processes"]
    assert summary["server"]["pid"] in pids and [pid for pid in pids if running(pid)] == []
    ports = list(summary["server"]["ports"].values())
    assert [port for port in ports if not port_free(port)] == [] and summary["teardown"]["clean"] is True


@pytest.mark.parametrize("args, message", [
    (["--config", "nosuch"], "unknown model config 'nosuch'"),
    (["--batches", "1"], "--batches 1: needs a warm-up batch"),
    (["--batch-size", "9"], "--batch-size '9': use a whole number of users in 1..8"),
    (["--store", "/nonexistent/store"], "--store /nonexistent/store: no such store directory"),
    (["--ports", "1,2"], "--ports '1,2': give four port numbers"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything(tmp_path, args, message):
    out = tmp_path / "l0"
    result = _flow("--out", str(out), "--device", "cpu", *args, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [result.stderr.strip()] and message in result.stderr
    assert result.stderr.startswith("hstu-replay: error: ")
    assert not out.exists()


@pytest.mark.parametrize("change, args, reason", [
    ({"weights": "0123456789abcdef"}, [], "compiled from other weights than this version of the model draws for "
                                          "seed 0 (another version of hstu-replay)"),
    ({}, ["--seed", "3"], "compiled for config small, seed 0, device cpu; asked for small, 3, cpu"),
], ids=["other weights", "another seed"])
def test_a_repository_that_does_not_serve_the_flow_is_refused_before_anything(
        tmp_path, compiled_repository, change, args, reason):
    """A repository exported by a version of the model that drew other weights for the same seed, or for
    another seed, would answer unlike the engines the flow's reference is computed with."""
    import json
    import shutil

    repository = tmp_path / "older"
    shutil.copytree(compiled_repository, repository)
    record = repository / "hstu_target.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), **change}))
    out = tmp_path / "l0"
    result = _flow("--out", str(out), "--export-from", str(repository), "--device", "cpu", *args, timeout=120)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [f"hstu-replay: error: --export-from {repository}: {reason}; export it again"]
    assert not out.exists()


def test_a_foreign_non_empty_out_is_refused_and_left_untouched(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    result = _flow("--out", str(out), "--device", "cpu", timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"--out {out}: a non-empty folder the flow did not make" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]


def test_hits_other_than_the_passes_are_named_for_are_flagged():
    passes = [{"phase": "cold", "hit_ratio": 0.0}, {"phase": "cached", "hit_ratio": 1.0}]
    assert hit_warnings(passes) == []
    assert hit_warnings([{"phase": "cold", "hit_ratio": 0.25}, {"phase": "cached", "hit_ratio": 0.8125}]) == [
        "pass cold: the server reports hit ratio 0.250, not 0",
        "pass cached: the server reports hit ratio 0.812, not 1"]
    assert hit_warnings([{"phase": "cold", "hit_ratio": None}, {"phase": "cached", "hit_ratio": None}]) == []
