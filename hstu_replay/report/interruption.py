"""A run ended by a signal (Ctrl-C, SIGTERM) before its sweep did, in the report's words.

report.json's `interrupted` section says when, by which signal, and which stages ran fully, which
partly and which never started; the stage it cut is flagged `interrupted` (its figures cover part
of its window). Null for a run that was not interrupted. An interrupted run never passes.
"""

from __future__ import annotations

from datetime import datetime, timezone

INTERRUPTED = "interrupted"


def interruption(signal_name: str, at_epoch: float, at_s: float | None, full: list[str], partial: list[str],
                 not_run: list[str]) -> dict:
    """The `interrupted` section: `at_s` is the sweep's clock (None before the sweep started)."""
    return {"signal": signal_name,
            "at": datetime.fromtimestamp(at_epoch, timezone.utc).isoformat(timespec="seconds"),
            "at_s": at_s, "stages_full": full, "stages_partial": partial, "stages_not_run": not_run}


def with_interruption(report: dict, section: dict | None) -> dict:
    """`report` with its `interrupted` section, and the flag on each stage (and bin) it cut."""
    report["interrupted"] = section
    if section is None:
        return report
    bins = {b["name"]: b for b in report["bins"]}
    reason = f"{section['signal']} {_at(section['at_s'])} ended the run during this stage: its figures cover part of it"
    for stage in (s for s in report["stages"] if s["name"] in section["stages_partial"]):
        stage["flags"].append({"flag": INTERRUPTED, "reason": reason})
        if stage["name"] in bins and INTERRUPTED not in bins[stage["name"]]["flags"]:
            bins[stage["name"]]["flags"].append(INTERRUPTED)
    return report


def _at(seconds: float | None) -> str:
    return "before the sweep started" if seconds is None else f"at {seconds:.1f} s"


def _names(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def interruption_line(report: dict) -> str | None:
    """The one line saying the run was interrupted (the terminal's and the page's); None if it was not."""
    section = report.get("interrupted")
    if section is None:
        return None
    return (f"interrupted by {section['signal']} {_at(section['at_s'])}: stages run fully: "
            f"{_names(section['stages_full'])}; partly: {_names(section['stages_partial'])}; "
            f"never started: {_names(section['stages_not_run'])}")
