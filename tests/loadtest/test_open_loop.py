"""Open-loop arrivals against the real target: the requested rate is kept, and a server that
cannot keep up is charged from the intended send times (no coordinated omission)."""

from __future__ import annotations

import pytest

from hstu_replay.loadtest.records import read_records
from tests.conftest import run_locust

pytestmark = pytest.mark.integration


def open_loop(server, dumps, report_dir, arrival: str, rate: float, users: int, ratio: str):
    return run_locust(
        report_dir, "-u", str(users), "-r", str(users), "--triton-url", server.grpc_url, "--workload", "dumps",
        "--dump-dir", str(dumps), "--hit-ratios", ratio, "--batch-sizes", "1", "--stage-seconds", "8",
        "--warmup-seconds", "1", "--max-history", "256", "--arrival", arrival, "--request-rate", str(rate),
    )


@pytest.mark.parametrize("arrival", ["constant", "poisson"])
def test_requested_rate_is_achieved(triton_server, reference_dumps, tmp_path, arrival):
    result = open_loop(triton_server, reference_dumps, tmp_path, arrival, rate=8.0, users=4, ratio="1.0")
    assert result.returncode == 0, result.stderr[-2000:]
    (b,) = result.report["bins"]
    assert b["requested_rps"] == 8.0
    tolerance = 0.15 if arrival == "constant" else 0.35  # Poisson counts over 8 s vary by ~1/sqrt(64)
    assert b["throughput_rps"] == pytest.approx(8.0, rel=tolerance)
    assert b["lag_p50_ms"] < 50
    assert b["corrected_p50_ms"] >= b["p50_ms"]


def test_an_overloaded_server_is_charged_from_intended_send_times(triton_server, reference_dumps, tmp_path):
    result = open_loop(triton_server, reference_dumps, tmp_path, "constant", rate=400.0, users=1, ratio="0")
    assert result.returncode == 0, result.stderr[-2000:]
    (b,) = result.report["bins"]
    assert b["throughput_rps"] < 0.5 * 400  # one stream cannot keep up with 400/s
    assert b["lag_p99_ms"] > 500  # the schedule fell behind ...
    assert b["corrected_p99_ms"] > 5 * b["p99_ms"]  # ... and the report says so


def test_priming_is_sent_ahead_and_not_charged_to_lag(triton_server, reference_dumps, tmp_path):
    # Every 0.5 step primes first; the prime used to sit inside the measured request's lag.
    result = open_loop(triton_server, reference_dumps, tmp_path, "constant", rate=8.0, users=2, ratio="0.5")
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_records(tmp_path)
    primes = sorted(r["latency_ms"] for r in records if r["label"].endswith("(prime)"))
    lags = sorted(r["lag_ms"] for r in records if r["kind"] == "measure")
    assert primes and lags
    assert lags[len(lags) // 2] < primes[len(primes) // 2] / 2

