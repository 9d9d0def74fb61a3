import json
from datetime import datetime, timezone

import pytest

import hstu_replay
from hstu_replay.report.summary import build_report, latency_table
from hstu_replay.stats.causes import ErrorCause
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

WHEN = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def _bin(ms, **counts) -> BinStats:
    return BinStats(latency=LatencyHistogram.of(m / 1e3 for m in ms), requests=len(ms), **counts)


def hand_stats() -> RunStats:
    """Four bins with hand-worked figures (see the assertions)."""
    stats = RunStats(warmup_requests=12, errors={"timeout": ErrorCause(2, "timeout"),
                                                    "HTTP 500": ErrorCause(5, "HTTP 500")})
    # below 2.048 ms the histogram is exact
    stats.bins[BinKey(1, 0.0)] = _bin([0.4, 0.8, 1.2, 1.6], errors=1, logical_requests=4,
                                      history_tokens=1000, first_start=100.0, last_end=102.0)
    stats.bins[BinKey(1, 1.0)] = _bin([0.2, 0.4, 0.6, 0.8], logical_requests=4,
                                      history_tokens=1000, expected_hits=1000,
                                      predicted_hits=1000, observed_hits=900,
                                      observed_tokens=1000, hit_disagreements=2, verified=4,
                                      mismatches=1, first_start=100.0, last_end=104.0)
    stats.bins[BinKey(8, 0.5)] = _bin([10, 20, 30, 40], logical_requests=32,
                                      history_tokens=2000, expected_hits=1000,
                                      predicted_hits=1100, verified=4, prime_requests=7, prime_failures=1,
                                      first_start=50.0, last_end=58.0)
    stats.bins[BinKey(8, 1.0)] = BinStats()  # planned but nothing measured
    return stats


def hand_report(**kw) -> dict:
    run = {"model": "hstu-kuairand", "users": 16, "options": {"seed": 1}}
    return build_report(hand_stats(), run, created=WHEN, **kw)


def by_name(report):
    return {b["name"]: b for b in report["bins"]}


def test_header_and_totals():
    r = hand_report()
    assert r["tool"] == "hstu-replay" and r["version"] == hstu_replay.__version__
    assert r["created"] == "2024-05-01T12:00:00+00:00"
    assert r["run"]["options"] == {"seed": 1}
    assert r["verification"] == {"verified": 8, "mismatches": 1, "tolerance": 0.0625}
    assert r["primes"] == {"requests": 7, "failures": 1}
    assert r["warmup_requests"] == 12
    assert list(r["errors"].items()) == [("HTTP 500", 5), ("timeout", 2)]  # most frequent first
    assert list(r["error_examples"].items()) == [("HTTP 500", "HTTP 500"), ("timeout", "timeout")]
    assert r["thresholds"] is None


def test_created_defaults_to_now_in_utc():
    created = datetime.fromisoformat(build_report(RunStats(), {})["created"])
    assert created.utcoffset().total_seconds() == 0
    assert abs((datetime.now(timezone.utc) - created).total_seconds()) < 60


def test_bins_sorted_by_batch_then_ratio():
    names = [b["name"] for b in hand_report()["bins"]]
    assert names == ["b1_h0.00", "b1_h1.00", "b8_h0.50", "b8_h1.00"]
    assert [s["name"] for s in hand_report()["stages"]] == names


def test_exact_percentiles_and_speedup():
    b = by_name(hand_report())
    base, full = b["b1_h0.00"], b["b1_h1.00"]
    assert base["mean_ms"] == pytest.approx(1.0)
    assert (base["p50_ms"], base["p90_ms"], base["p99_ms"], base["max_ms"]) == (0.8, 1.6, 1.6, 1.6)
    assert full["mean_ms"] == pytest.approx(0.5)
    assert full["p50_ms"] == 0.4
    assert full["speedup"] == pytest.approx(2.0)  # 1.0 ms / 0.5 ms
    assert base["speedup"] == pytest.approx(1.0)


def test_bucketed_percentiles_within_a_tenth_of_a_percent():
    b = by_name(hand_report())["b8_h0.50"]
    assert b["mean_ms"] == pytest.approx(25.0)
    assert b["p50_ms"] == pytest.approx(20.0, rel=1e-3)
    assert b["p99_ms"] == 40.0  # capped at the recorded maximum
    assert b["speedup"] is None  # batch 8 has no 0.0 bin


def test_ratios_rates_and_counts():
    r = hand_report()
    b = by_name(r)
    assert b["b1_h0.00"]["error_ratio"] == pytest.approx(0.2)  # 1 failure / 5 sent
    assert b["b1_h1.00"]["failures"] == 1  # a wrong answer is a failure ...
    assert b["b1_h1.00"]["error_ratio"] == pytest.approx(0.25)  # ... of 4 answered
    assert b["b8_h0.50"]["prime_requests"] == 7 and b["b8_h0.50"]["primes_per_request"] == pytest.approx(1.75)
    assert b["b8_h0.50"]["server_rps"] == pytest.approx(11 / 8)  # 4 measured + 7 primes in 8 s
    assert b["b1_h0.00"]["throughput_rps"] == pytest.approx(2.0)  # 4 requests in 2 s
    assert b["b8_h0.50"]["throughput_rps"] == pytest.approx(0.5)  # 4 requests in 8 s
    assert b["b8_h0.50"]["logical_throughput"] == pytest.approx(4.0)  # 32 users in 8 s
    assert b["b8_h0.50"]["achieved_ratio"] == pytest.approx(0.55)  # predicted 1100 / 2000
    assert b["b1_h1.00"]["achieved_ratio"] == pytest.approx(0.9)  # the server's word wins
    assert (b["b1_h1.00"]["hit_source"], b["b8_h0.50"]["hit_source"]) == ("observed", "predicted")
    stages = {s["name"]: s for s in r["stages"]}
    s = stages["b1_h1.00"]
    assert (s["predicted_ratio"], s["observed_ratio"], s["expected_ratio"]) == (1.0, 0.9, 1.0)
    assert s["hit_disagreements"] == 2 and s["requests"] == 4
    assert stages["b8_h0.50"]["observed_ratio"] is None
    assert stages["b8_h0.50"]["expected_ratio"] == pytest.approx(0.5)


def test_empty_bin_is_all_nulls_not_nan():
    r = hand_report()
    empty = by_name(r)["b8_h1.00"]
    for key in ("achieved_ratio", "error_ratio", "throughput_rps", "logical_throughput",
                "mean_ms", "p50_ms", "p999_ms", "max_ms", "speedup"):
        assert empty[key] is None, key
    text = json.dumps(r, allow_nan=False)  # raises on any NaN left behind
    assert json.loads(text) == r


def test_server_figures_attach_by_bin_name():
    server = {"b8_h0.50": {"queue_ms": 1.5, "compute_ms": float("nan")}}
    b = by_name(hand_report(server=server))
    assert b["b8_h0.50"]["server"] == {"queue_ms": 1.5, "compute_ms": None}
    assert b["b1_h0.00"]["server"] is None


def test_latency_table_rows():
    rows = latency_table(hand_report())
    assert rows[0] == ["batch", "target", "achieved", "from", "requests", "errors", "mismatches", "primes", "req/s",
                       "server req/s", "mean ms", "ms/logical", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "speed-up",
                       "flags"]
    assert rows[1][4:7] == ["4", "1", "0"] and rows[1][-1] == "errors,thin"  # 1 request of 5 got no answer
    assert rows[2] == ["1", "1", "0.900", "server", "4", "0", "1", "0", "1.0", "1.0", "0.50", "0.500", "0.40", "0.80",
                       "0.80", "0.80", "2.00x", "mismatches,thin"]  # 1 of its 4 answers was wrong
    assert rows[3][2:10] == ["0.550", "model", "4", "0", "0", "7", "0.5", "1.4"]  # 11 server requests in 8 s
    assert rows[3][10:12] == ["25.00", "3.125"]  # 25 ms for a request of 8 users
    assert rows[3][-1] == "thin"  # a failed prime is not a measured request that failed
    assert rows[4][2:] == ["-", "-", "0", "0", "0", "0", "-", "-", "-", "-", "-", "-", "-", "-", "-", "thin"]


def test_ms_per_logical_request_is_the_mean_over_the_users_of_a_request():
    # NVIDIA's latency per logical request: (10 + 20 + 30 + 40) / 4 = 25 ms a request of 8 users -> 3.125 ms
    r = hand_report()
    b = by_name(r)
    stages = {s["name"]: s for s in r["stages"]}
    assert b["b1_h0.00"]["ms_per_logical_request"] == pytest.approx(1.0)  # batch 1: the mean itself
    assert b["b8_h0.50"]["ms_per_logical_request"] == pytest.approx(3.125, rel=1e-3)
    assert b["b8_h1.00"]["ms_per_logical_request"] is None  # nothing measured
    assert stages["b8_h0.50"]["ms_per_logical_request"] == b["b8_h0.50"]["ms_per_logical_request"]
    assert stages["b8_h0.50"]["mean_ms"] == pytest.approx(25.0, rel=1e-3)


def test_distinct_target_ratios_get_distinct_bin_names():
    # two decimals used to merge 0.949 and 0.951 into one "0.95" bin
    names = {BinKey(1, r).name() for r in (0.949, 0.95, 0.951, 0.5, 1.0, 0.0)}
    assert names == {"b1_h0.949", "b1_h0.95", "b1_h0.951", "b1_h0.50", "b1_h1.00", "b1_h0.00"}


def test_client_cpu_per_request_counts_every_measured_request_sent():
    # 0.84 s of load-generator CPU over 1,990 answered and 10 failed requests: 0.42 ms each
    stats = RunStats()
    stats.bins[BinKey(8, 0.5)] = BinStats(requests=1990, errors=10, client_cpu_s=0.84, client_wall_s=10.0)
    stats.bins[BinKey(8, 1.0)] = BinStats(requests=5)  # the client's CPU was never sampled
    stages = {s["name"]: s for s in build_report(stats, {}, created=WHEN)["stages"]}
    assert stages["b8_h0.50"]["client_cpu_ms_per_request"] == pytest.approx(0.42)
    assert stages["b8_h0.50"]["client_cpu_s"] == 0.84
    assert stages["b8_h1.00"]["client_cpu_ms_per_request"] is None
