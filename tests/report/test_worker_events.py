"""A distributed run's lost and joined workers in the report: entries, flags, lines, page, threshold."""

from __future__ import annotations

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.report.html import render_html
from hstu_replay.report.summary import build_report
from hstu_replay.report.thresholds import evaluate, parse_thresholds
from hstu_replay.report.worker_events import joined, loss, loss_lines, with_workers
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats


def two_stage_report() -> dict:
    stats = RunStats()
    for ratio in (0.0, 0.9):
        stats.bins[BinKey(2, ratio)] = BinStats(requests=100, logical_requests=200, history_tokens=200_000,
                                                predicted_hits=round(ratio * 200_000))
    return build_report(stats, {"workers": 2})


def test_a_loss_flags_the_stages_it_overlapped_with_users_before_and_after():
    lost = loss(1, "host_abc", 6.25, "b2_h0.90", 2, 4, ["b2_h0.90"], sent=120, received=100)
    report = with_workers(two_stage_report(), [lost], [], workers_end=1)
    assert lost["users_after"] == 2 and lost["measured_unreceived"] == 20
    first, second = report["stages"]
    assert first["flags"] == [] and report["bins"][0]["flags"] == []
    assert second["flags"] == [{"flag": "worker-lost", "reason": "worker 1 lost at 6.2 s: users 4 -> 2"}]
    assert report["bins"][1]["flags"] == ["worker-lost"]
    assert report["run"]["workers_end"] == 1 and report["workers_lost"] == [lost]


def test_the_lines_say_who_when_where_how_many_and_what_never_arrived():
    known = loss(1, "h_1", 6.25, "b2_h0.90", 2, 4, ["b2_h0.90"], sent=120, received=100)
    unknown = loss(0, "h_0", None, None, 2, 2, ["b2_h0.00", "b2_h0.90"], sent=None, received=7)
    report = with_workers(two_stage_report(), [known, unknown], [joined(2, "h_2", 8.0, "b2_h0.90")], 1)
    assert loss_lines(report) == [
        "worker 1 (h_1) lost at 6.2 s in stage b2_h0.90, holding 2 users (users 4 -> 2); "
        "20 of its 120 measured requests never reached the master",
        "worker 0 (h_0) lost before the sweep, holding 2 users (users 2 -> 0); 7 measured requests received; "
        "how many more it sent is unknown (no records file)",
        "worker 2 (h_2) joined at 8.0 s in stage b2_h0.90: its users started with an empty cache"]
    page = render_html(report)
    assert "Workers lost or joined" in page and "worker-lost" in page and "unknown" in page


def test_a_run_that_kept_its_workers_says_nothing_of_them():
    report = with_workers(two_stage_report(), [], [], workers_end=2)
    assert loss_lines(report) == [] and "Workers lost" not in render_html(report)
    assert all(not s["flags"] for s in report["stages"])


def test_max_workers_lost_fails_the_run_beyond_its_count():
    lost = loss(1, "h_1", 6.0, "b2_h0.90", 2, 4, ["b2_h0.90"], sent=None, received=0)
    report = with_workers(two_stage_report(), [lost], [], workers_end=1)
    assert evaluate(report, parse_thresholds(max_workers_lost=1)) == [
        "stage b2_h0.90 is worker-lost: worker 1 lost at 6.0 s: users 4 -> 2"]  # a flagged stage fails any gate
    assert evaluate(report, parse_thresholds(max_workers_lost=0))[-1] == "1 workers lost > 0 allowed"
    assert parse_thresholds().empty and not parse_thresholds(max_workers_lost=0).empty
    with pytest.raises(ConfigError, match="--max-workers-lost"):
        parse_thresholds(max_workers_lost=-2)


def test_the_web_ui_tab_says_which_worker_was_lost():
    from hstu_replay.loadtest.webui import charts_fragment

    lost = loss(1, "h<1>", 6.0, "b2_h0.90", 2, 4, ["b2_h0.90"], sent=None, received=0)
    fragment = charts_fragment(with_workers(two_stage_report(), [lost], [], workers_end=1))
    assert "worker 1 (h&lt;1&gt;) lost at 6.0 s in stage b2_h0.90" in fragment
