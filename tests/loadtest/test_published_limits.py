"""Limits known before the load, and a dump checked before it, against a real tritonserver: the shared
server (small model: 256 history items) publishes its limits; a second one, started with
--no-limit-parameters, publishes none, as NVIDIA's server does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import MACHINE_LENIENT, run_distributed, run_locust, start_server, stop_server

pytestmark = pytest.mark.integration


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error" in line.lower()]


def test_a_run_at_the_default_max_history_is_capped_and_no_request_fails(triton_server, long_store, tmp_path):
    # --max-history left at 4,096: the small model refuses any history beyond 256 items
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", triton_server.grpc_url, "--workload",
                        "sessions", "--store", str(long_store), "--hit-ratios", "0.5", "--batch-sizes", "8",
                        "--stage-seconds", "3", "--warmup-seconds", "1", "--max-error-ratio", "0", *MACHINE_LENIENT)
    assert result.violations_but_the_machines() == [], result.stderr[-2000:]
    report = result.report
    assert [(b["requests"] > 0, b["errors"], b["failures"]) for b in report["bins"]] == [(True, 0, 0)]
    assert report["run"]["server_limits"] == {
        "published": {"max_batch": 8, "max_values": 8 * (6 + 2 * (256 + 32)), "max_candidates": 32,
                      "max_history": 256},
        "caps": [{"option": "--max-history", "asked": 4096, "used": 256},
                 {"option": "--max-values", "asked": 40_000, "used": 4656}]}
    assert report["run"]["options"]["max_history"] == 256 and report["run"]["stopped"] is None
    assert ("hstu-replay: the server's model publishes its limits: --max-history 256 instead of the default 4,096, "
            "--max-values 4,656 instead of the default 40,000") in result.stderr
    sent = [json.loads(line) for path in tmp_path.glob("records-*.jsonl") for line in path.read_text().splitlines()]
    assert sent and all(r["ok"] for r in sent)
    assert max(r["tokens"] for r in sent) <= 8 * (6 + 2 * 256)  # 8 users of at most 256 items


def test_max_history_set_above_the_published_limit_is_refused_before_any_load(triton_server, long_store, tmp_path):
    result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", triton_server.grpc_url, "--workload",
                        "sessions", "--store", str(long_store), "--max-history", "1000", timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = error_lines(result.stderr)
    assert line == ("hstu-replay: error: --max-history 1000: the server's model takes at most 256 history items (it "
                    "publishes hstu_max_history_items); give --max-history 256 or less, or leave it out to take the "
                    "server's limit")
    assert not (tmp_path / "report.json").exists()


@pytest.fixture(scope="module")
def other_weights_dumps(long_store, tmp_path_factory) -> Path:
    """Dumps of the small model drawn as `reference_dumps` are, but written by weights of seed 1 (the
    shared server serves seed 0's)."""
    from hstu_replay.server.build import ENGINE_KINDS
    from hstu_replay.server.dump import write_reference_dumps
    from hstu_replay.server.model_config import get_config

    out = tmp_path_factory.mktemp("other-weights")
    engines = ENGINE_KINDS["batched"](None, get_config("small"), 1, 0, 32, "cpu")
    write_reference_dumps(engines.uncached, str(long_store), out, batches=2, batch_size=8, candidates=16,
                          max_history=256, seed=1, min_history=200)
    return out


def test_a_dump_written_by_other_weights_is_refused_before_any_stage(triton_server, other_weights_dumps, tmp_path):
    result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", triton_server.grpc_url, "--workload",
                        "dumps", "--dump-dir", str(other_weights_dumps), "--batch-sizes", "4", "--stage-seconds", "3",
                        "--warmup-seconds", "0", timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = error_lines(result.stderr)
    assert line.startswith(f"hstu-replay: error: --dump-dir {other_weights_dumps}: the served model does not answer "
                           "as the dump says, before any load: batch_000000 user ")
    assert "expected" in line and "got" in line and "> tolerance 0.0625" in line
    assert "hstu-replay server dump --repository" in line
    assert not (tmp_path / "report.json").exists()
    assert all(not p.read_text() for p in tmp_path.glob("records-*.jsonl"))  # no stage sent anything


@pytest.fixture(scope="module")
def unpublished_server(compiled_repository, tmp_path_factory):
    """The small model served with no limit parameters in its configuration (as NVIDIA's is)."""
    server = start_server(compiled_repository, tmp_path_factory.mktemp("unpublished") / "server.log",
                          "--no-limit-parameters")
    yield server
    assert stop_server(server) == 0


def test_a_limit_refused_by_a_server_that_publishes_none_stops_the_distributed_run(unpublished_server, long_store,
                                                                                    tmp_path):
    started = time.monotonic()
    code, report_dir, master_log = run_distributed(
        tmp_path, "--triton-url", unpublished_server.grpc_url, "--workload", "sessions", "--store", str(long_store),
        "--hit-ratios", "0", "--batch-sizes", "1", "--stage-seconds", "120", "--warmup-seconds", "0",
        "--verify-fraction", "0", users=2, workers=2)
    assert time.monotonic() - started < 90  # stopped at the first refusal, not sat out
    assert code == 6, master_log[-3000:]
    (line,) = [line for line in master_log.splitlines() if "hstu-replay: error" in line]
    assert line.startswith("hstu-replay: error: worker ") and line.endswith(
        ": its limit is 256; set --max-history 256 or less")
    assert "the server refused a history of " in line
    report = json.loads((report_dir / "report.json").read_text())
    assert report["run"]["stopped"] == line.removeprefix("hstu-replay: error: ")
    assert report["run"]["server_limits"] is None
    assert sum(report["errors"].values()) >= 1  # the refusals, counted


def test_a_limit_refused_by_a_server_that_publishes_none_stops_a_local_run(unpublished_server, long_store, tmp_path):
    result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", unpublished_server.grpc_url, "--workload",
                        "sessions", "--store", str(long_store), "--hit-ratios", "0", "--batch-sizes", "1",
                        "--stage-seconds", "120", "--warmup-seconds", "0", "--max-error-ratio", "0", timeout=90)
    assert result.returncode == 6, result.stderr[-2000:]  # whatever the thresholds say
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("hstu-replay: error")]
    assert line.startswith("hstu-replay: error: the server refused a history of ")
    assert line.endswith(" items: its limit is 256; set --max-history 256 or less")
    assert result.report["run"]["stopped"] == line.removeprefix("hstu-replay: error: ")
