"""The run's last lines: the verdict or a summary, and the largest causes of failure."""

from __future__ import annotations

from hstu_replay.report.outcome import cause_lines, outcome_line


def _report(thresholds=None, errors=None, examples=None) -> dict:
    """Two stages: 1,200 answered + 30 unanswered, and 4 answered + 0; 1,204 verified, 2 wrong."""
    return {"bins": [{"requests": 1200, "errors": 30}, {"requests": 4, "errors": 0}],
            "verification": {"verified": 1204, "mismatches": 2, "tolerance": 0.0625},
            "thresholds": thresholds, "errors": errors or {}, "error_examples": examples or {}}


def test_a_run_without_thresholds_says_what_was_sent_and_what_failed():
    assert outcome_line(_report()) == ("1,234 measured requests sent, 30 failed, 2 mismatched "
                                       "(1,204 answers verified); no thresholds set")


def test_a_passing_run_names_the_thresholds_met_and_the_answers_verified():
    passed = {"passed": True, "violations": [], "checked": ["p99 <= 250 ms", "error ratio <= 0.05", "mismatches <= 2"]}
    assert outcome_line(_report(passed)) == ("PASS: 3 thresholds met (p99 <= 250 ms, error ratio <= 0.05, "
                                             "mismatches <= 2); 1,204 answers verified, 2 mismatches")
    one = {"passed": True, "violations": [], "checked": ["p99 <= 250 ms"]}
    assert outcome_line(_report(one)).startswith("PASS: 1 threshold met (p99 <= 250 ms); ")
    assert outcome_line(_report({"passed": False, "violations": ["x"], "checked": ["p99 <= 250 ms"]})) is None


def test_the_largest_causes_with_a_count_and_an_example_each():
    errors = {f"cause {c}": n for c, n in zip("ABCDEFG", (1200, 30, 9, 5, 2, 1, 1))}
    examples = {cause: cause.replace("cause", "example") for cause in errors}
    lines = cause_lines(_report(errors=errors, examples=examples))
    assert lines[0] == "failures by cause: 1,248 in 7 causes, the 5 largest:"
    assert lines[1:5] == ["  1,200  cause A", "         e.g. example A", "     30  cause B", "         e.g. example B"]
    assert lines[-2:] == ["      2  cause E", "         e.g. example E"] and len(lines) == 1 + 2 * 5
    assert cause_lines(_report(errors={"timeout": 1}, examples={"timeout": "timeout"})) == [
        "failures by cause: 1 in 1 cause:", "  1  timeout", "     e.g. timeout"]
    assert cause_lines(_report()) == []
