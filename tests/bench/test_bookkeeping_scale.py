"""`python -m bench.bookkeeping_scale --quick` runs through the real classes and finds bookkeeping bounded.

No timing is asserted here (figures belong in BENCHMARKS.md): only that the run completes, the
cache model's resident keys stay bounded, the process's memory stays flat in run length, and
the final report holds every request the workers filed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def table_rows(text: str, header_start: str) -> list[list[str]]:
    """Cells of the markdown table whose header row starts with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def number(cell: str) -> int:
    return int(cell.replace(",", ""))


@pytest.mark.integration  # a bench run through Locust's real classes (about 25 s)
def test_quick_run_keeps_the_bookkeeping_bounded(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.bookkeeping_scale", "--quick", "--out-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout

    cache = table_rows(out, "| cache model |")
    resident = {}
    for variant, requests, _, keys, _, _ in cache:
        resident.setdefault(variant, []).append((number(requests), number(keys)))
    retired = next(v for k, v in resident.items() if k.startswith("no budget, retired"))
    budgeted = next(v for k, v in resident.items() if k.startswith("budget"))
    kept = next(v for k, v in resident.items() if k.startswith("no budget, keys kept"))
    assert all(keys == 0 for _, keys in retired)  # single-use keys forgotten once retired
    assert len({keys for _, keys in budgeted}) == 1 and budgeted[0][1] > 0  # the LRU holds a fixed set
    assert [keys for _, keys in kept] == [8 * requests for requests, _ in kept]  # the reference grows

    samples = table_rows(out, "| requests sent |")
    assert len(samples) == 10 and number(samples[-1][0]) == 200_000
    assert "flat: yes" in out

    report = json.loads((tmp_path / "report.json").read_text())
    filed = sum(b["requests"] + b["prime_requests"] for b in report["bins"]) + report["warmup_requests"]
    assert filed >= 200_000 and report["errors"] == {}
    assert [b["name"] for b in report["bins"]] == ["b8_h0.00", "b8_h0.50", "b8_h0.90", "b8_h1.00"]
    assert all(not b["flags"] for b in report["bins"])
    for name in ("report.csv", "report.html"):
        assert (tmp_path / name).stat().st_size > 0
    records = sorted(tmp_path.glob("records-worker*.jsonl"))
    assert len(records) == 2
    lines = sum(path.read_bytes().count(b"\n") for path in records)
    assert lines == filed
    for path in records:  # ~100 MiB: not left behind in pytest's kept temporary folders
        path.unlink()
