"""An interrupted run in the report: its section, the flag on the stage it cut, its line, its verdict."""

from __future__ import annotations

from hstu_replay.report.flags import FLAG_MEANINGS
from hstu_replay.report.interruption import INTERRUPTED, interruption, interruption_line, with_interruption
from hstu_replay.report.thresholds import Thresholds, evaluate

# 2026-01-02T03:04:05Z
AT = 1767323045.0


def report_of(*names: str) -> dict:
    return {"stages": [{"name": n, "flags": []} for n in names], "bins": [{"name": n, "flags": []} for n in names],
            "verification": {"mismatches": 0}}


def test_the_section_says_when_by_which_signal_and_how_far_the_sweep_got():
    section = interruption("SIGINT", AT, 7.25, ["b1_h0.00"], ["b1_h0.50"], ["b1_h1.00"])
    assert section == {"signal": "SIGINT", "at": "2026-01-02T03:04:05+00:00", "at_s": 7.25,
                       "stages_full": ["b1_h0.00"], "stages_partial": ["b1_h0.50"], "stages_not_run": ["b1_h1.00"]}


def test_the_stage_it_cut_is_flagged_and_the_others_are_not():
    report = with_interruption(report_of("b1_h0.00", "b1_h0.50"),
                               interruption("SIGTERM", AT, 4.0, ["b1_h0.00"], ["b1_h0.50"], ["b1_h1.00"]))
    assert report["stages"][0]["flags"] == [] and report["bins"][0]["flags"] == []
    assert report["stages"][1]["flags"] == [
        {"flag": "interrupted", "reason": "SIGTERM at 4.0 s ended the run during this stage: its figures cover part of it"}]
    assert report["bins"][1]["flags"] == ["interrupted"]
    assert INTERRUPTED in FLAG_MEANINGS
    assert interruption_line(report) == ("interrupted by SIGTERM at 4.0 s: stages run fully: b1_h0.00; "
                                         "partly: b1_h0.50; never started: b1_h1.00")


def test_with_any_threshold_the_cut_stage_is_a_violation():
    report = with_interruption(report_of("b1_h0.00", "b1_h0.50"),
                               interruption("SIGINT", AT, 4.0, ["b1_h0.00"], ["b1_h0.50"], []))
    assert evaluate(report, Thresholds(max_mismatches=0)) == [
        "the run was interrupted by SIGINT",
        "stage b1_h0.50 is interrupted: SIGINT at 4.0 s ended the run during this stage: its figures cover part of it"]
    spawning = with_interruption(report_of(), interruption("SIGTERM", AT, None, [], [], ["b1_h0.00"]))
    assert evaluate(spawning, Thresholds(max_mismatches=0)) == ["the run was interrupted by SIGTERM"]  # no stage cut


def test_before_the_sweep_nothing_is_flagged_and_a_run_not_interrupted_says_null():
    report = with_interruption(report_of(), interruption("SIGINT", AT, None, [], [], ["b1_h0.00"]))
    assert interruption_line(report) == ("interrupted by SIGINT before the sweep started: stages run fully: none; "
                                         "partly: none; never started: b1_h0.00")
    plain = with_interruption(report_of("b1_h0.00"), None)
    assert plain["interrupted"] is None and interruption_line(plain) is None and plain["stages"][0]["flags"] == []
