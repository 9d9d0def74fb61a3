"""docs/reference/reports.md names every key a load-test report carries, every CSV column and every flag."""

from __future__ import annotations

from pathlib import Path

from hstu_replay.report.flags import FLAG_MEANINGS
from hstu_replay.report.summary import build_report
from hstu_replay.report.tier_section import TIER_COLUMNS
from hstu_replay.report.writers import report_csv
from hstu_replay.stats.causes import ErrorCause
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "reports.md"


def _report() -> dict:
    stats = RunStats(warmup_requests=3, errors={"timeout": ErrorCause(1, "timeout")})
    for key in (BinKey(1, 0.0), BinKey(8, 0.5)):
        stats.bins[key] = BinStats(latency=LatencyHistogram.of([0.001, 0.002]), requests=2, logical_requests=2 * key.batch_size,
                                   history_tokens=1000, first_start=0.0, last_end=2.0)
    return build_report(stats, {"model": "m"}, server={"b1_h0.00": {"queue_ms": 0.1}}, requested_rps=5.0)


def _named(key: str) -> bool:
    return f"`{key}`" in PAGE.read_text()


def test_every_key_of_report_json_is_named():
    report = _report()
    keys = set(report) | {k for s in report["stages"] for k in s} | {k for b in report["bins"] for k in b}
    missing = sorted(k for k in keys if not _named(k))
    assert not missing, f"report.json keys not on {PAGE.name}: {missing}"


def test_every_csv_column_is_named():
    report = _report()
    header = report_csv(report).splitlines()[0].split(",")
    bin_keys = set(report["bins"][0])
    assert "server_queue_ms" in header  # the server's figures come last, prefixed
    columns = [c if c in bin_keys else c.removeprefix("server_") for c in header] + list(TIER_COLUMNS)
    missing = sorted(c for c in columns if not _named(c))
    assert not missing, f"report.csv columns not on {PAGE.name}: {missing}"


def test_every_flag_is_explained():
    rows = [line for line in PAGE.read_text().splitlines() if line.startswith("| `")]
    explained = {line.split("`")[1] for line in rows}
    assert set(FLAG_MEANINGS) <= explained, set(FLAG_MEANINGS) - explained
