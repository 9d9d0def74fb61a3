"""The report of a run: report.json, CSV, SVG charts, one self-contained HTML page, CI thresholds.

`build_report` turns RunStats into one JSON-safe object; everything else reads that object.
"""

from hstu_replay.report.summary import build_report, latency_table
from hstu_replay.report.thresholds import Thresholds, evaluate, parse_thresholds, verdict
from hstu_replay.report.writers import WRITERS, write_reports

__all__ = [
    "WRITERS",
    "Thresholds",
    "build_report",
    "evaluate",
    "latency_table",
    "parse_thresholds",
    "verdict",
    "write_reports",
]
