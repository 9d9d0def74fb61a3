"""Stage flags against hand-worked stages, and thresholds failing on them."""

from __future__ import annotations

from hstu_replay.report.flags import StageRules, stage_flags
from hstu_replay.report.summary import build_report
from hstu_replay.report.thresholds import evaluate, parse_thresholds
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

RULES = StageRules(min_requests=30, page_tokens=32, client_cpu_bound=0.9, loop_lag_bound_ms=50)


def stage(requests=100, mean_tokens=1000, achieved=0.5, **extra) -> BinStats:
    """`requests` measured single-user requests of `mean_tokens` history tokens at `achieved`."""
    tokens = requests * mean_tokens
    return BinStats(requests=requests, logical_requests=requests, history_tokens=tokens,
                    predicted_hits=round(achieved * tokens), **extra)


def names(s: BinStats, target=0.5) -> list[str]:
    return [f["flag"] for f in stage_flags(BinKey(1, target), s, RULES)]


def test_a_solid_stage_has_no_flags():
    assert names(stage()) == []


def test_too_few_measured_requests_is_thin():
    (flag,) = stage_flags(BinKey(1, 0.5), stage(requests=29), RULES)
    assert flag == {"flag": "thin", "reason": "29 measured requests < 30"}
    assert names(stage(requests=30)) == []


def test_off_target_within_a_page_of_the_mean_history():
    # tolerance max(0.005, 32 / 1000) = 0.032
    assert names(stage(achieved=0.53)) == []
    assert names(stage(achieved=0.54)) == ["off-target"]
    # long histories: tolerance max(0.005, 32 / 8000 = 0.004) = 0.005
    assert names(stage(mean_tokens=8000, achieved=0.504)) == []
    assert names(stage(mean_tokens=8000, achieved=0.507)) == ["off-target"]


def test_a_busy_client_is_client_bound():
    assert names(stage(client_cpu_peak=0.95)) == ["client-bound"]
    assert names(stage(client_cpu_peak=0.85)) == []
    late = LatencyHistogram.of([0.001] * 98 + [0.2] * 2)  # p99 200 ms
    assert names(stage(loop_lag=late)) == ["client-bound"]
    on_time = LatencyHistogram.of([0.001] * 99 + [0.2])  # p99 1 ms
    assert names(stage(loop_lag=on_time)) == []


def test_server_downtime_is_flagged():
    (flag,) = stage_flags(BinKey(1, 0.5), stage(server_down_s=10.25), RULES)
    assert flag == {"flag": "server-down", "reason": "the server was unreachable for 10.2 s"}


def test_thresholds_fail_on_a_flagged_stage_naming_it():
    stats = RunStats()
    stats.bins[BinKey(8, 0.5)] = stage(requests=4)
    stats.bins[BinKey(8, 0.0)] = stage(requests=40, achieved=0.0)
    report = build_report(stats, {}, rules=RULES)
    assert evaluate(report, parse_thresholds(max_mismatches=0)) == [
        "stage b8_h0.50 is thin: 4 measured requests < 30"]
    assert [b["flags"] for b in report["bins"]] == [[], ["thin"]]


def test_failed_requests_and_wrong_answers_flag_the_stage_before_anything_else():
    # 163 of 209 sent got no answer; 2 of the 46 answered were checked and found wrong
    s = stage(requests=46, errors=163, verified=46, mismatches=2)
    assert stage_flags(BinKey(1, 0.5), s, RULES)[:2] == [
        {"flag": "errors", "reason": "163 of 209 measured requests failed"},
        {"flag": "mismatches", "reason": "2 of 46 verified answers differ from their reference"}]
    # every request failed: errors first, thin after it (nothing was measured)
    assert names(BinStats(errors=12)) == ["errors", "thin"]
    # every answer wrong (a dump of other weights), and plenty of them
    assert names(stage(requests=200, verified=200, mismatches=200)) == ["mismatches"]
    assert names(stage(verified=100)) == []


def _failing_report() -> dict:
    """b8_h0.50: 10 of 110 sent got no answer; b8_h1.00: 3 of its 100 answers wrong."""
    stats = RunStats()
    stats.bins[BinKey(8, 0.5)] = stage(requests=100, errors=10, verified=100)
    stats.bins[BinKey(8, 1.0)] = stage(requests=100, achieved=1.0, verified=100, mismatches=3)
    return build_report(stats, {}, rules=RULES)


def test_failures_fail_a_run_with_thresholds_once_by_their_flag():
    report = _failing_report()
    assert [b["flags"] for b in report["bins"]] == [["errors"], ["mismatches"]]
    assert evaluate(report, parse_thresholds(max_workers_lost=0)) == [  # no threshold allows any failure
        "stage b8_h0.50 is errors: 10 of 110 measured requests failed",
        "stage b8_h1.00 is mismatches: 3 of 100 verified answers differ from their reference"]


def test_a_threshold_that_allows_failures_alone_judges_them():
    report = _failing_report()
    # --max-error-ratio counts both: (10 + 3) / (110 + 100) = 0.062
    assert evaluate(report, parse_thresholds(max_error_ratio="0.1")) == []
    assert evaluate(report, parse_thresholds(max_error_ratio="0.05")) == ["error ratio 0.062 > 0.05"]
    # --max-mismatches judges the wrong answers; the failed requests still fail the run by their flag
    assert evaluate(report, parse_thresholds(max_mismatches=3)) == [
        "stage b8_h0.50 is errors: 10 of 110 measured requests failed"]
    assert evaluate(report, parse_thresholds(max_mismatches=2)) == [
        "stage b8_h0.50 is errors: 10 of 110 measured requests failed", "3 mismatches > 2 allowed"]
