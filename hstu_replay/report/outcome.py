"""A run's outcome in a few lines for the terminal: the verdict (or, without thresholds, what was
sent and what failed) and the largest causes of failure, each with one example message."""

from __future__ import annotations

#: How many causes of failure the end of a run names (report.json and report.html keep them all).
TOP_CAUSES = 5


def totals(report: dict) -> dict[str, int]:
    """Measured requests sent, failed (no answer), mismatched and verified, over every stage."""
    bins = report["bins"]
    return {"sent": sum(b["requests"] + b["errors"] for b in bins), "failed": sum(b["errors"] for b in bins),
            "mismatched": report["verification"]["mismatches"], "verified": report["verification"]["verified"]}


def outcome_line(report: dict) -> str | None:
    """With thresholds that passed, the PASS line naming them and the answers verified; without
    thresholds, what was sent and what failed; None where the thresholds failed (the FAIL line says why)."""
    t, outcome = totals(report), report["thresholds"]
    if outcome is None:
        return (f"{t['sent']:,} measured requests sent, {t['failed']:,} failed, {t['mismatched']:,} mismatched "
                f"({t['verified']:,} answers verified); no thresholds set")
    if not outcome["passed"]:
        return None
    checked = outcome["checked"]
    met = f"{len(checked)} threshold{'s' if len(checked) != 1 else ''} met ({', '.join(checked)})"
    return f"PASS: {met}; {t['verified']:,} answers verified, {t['mismatched']:,} mismatches"


def cause_lines(report: dict, top: int = TOP_CAUSES) -> list[str]:
    """The `top` most frequent causes of failure, a count and an example each; nothing without failures."""
    causes = list(report["errors"].items())  # most frequent first
    if not causes:
        return []
    total = sum(n for _, n in causes)
    shown = causes[:top]
    head = (f"failures by cause: {total:,} in {len(causes)} cause{'s' if len(causes) != 1 else ''}"
            + (f", the {len(shown)} largest:" if len(shown) < len(causes) else ":"))
    width = len(f"{shown[0][1]:,}")
    lines = [head]
    for cause, n in shown:
        lines.append(f"  {n:>{width},}  {cause}")
        lines.append(f"  {'':>{width}}  e.g. {report['error_examples'][cause]}")
    return lines
