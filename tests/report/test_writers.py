import csv
import json
import os
import sys
from datetime import datetime, timezone

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.report import plots, writers
from hstu_replay.report.html import render_html
from hstu_replay.report.summary import build_report
from hstu_replay.report.thresholds import evaluate, parse_thresholds, verdict
from hstu_replay.report.writers import WRITERS, atomic_write, write_reports
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_FILES = {"report.json", "report.csv", "report.html", *plots.PLOT_NAMES}
EVIL = "<script>alert('x')</script>"


def _bin(ms, **kw) -> BinStats:
    return BinStats(latency=LatencyHistogram.of(m / 1e3 for m in ms), requests=len(ms),
                    first_start=0.0, last_end=2.0, **kw)


@pytest.fixture
def report() -> dict:
    stats = RunStats(errors={EVIL: 1, "timeout": 4})
    stats.bins[BinKey(1, 0.0)] = _bin([0.4, 0.8, 1.2, 1.6], history_tokens=100, errors=1)
    stats.bins[BinKey(1, 1.0)] = _bin([0.2, 0.4, 0.6, 0.8], history_tokens=100,
                                      predicted_hits=100, verified=4)
    stats.bins[BinKey(8, 0.5)] = BinStats()  # nothing measured: nulls everywhere
    run = {"model": EVIL, "url": "http://triton:8000", "users": 4}
    server = {"b1_h1.00": {"queue_ms": 0.25, "compute_ms": 0.5}}
    r = build_report(stats, run, server, created=datetime(2024, 5, 1, tzinfo=timezone.utc))
    r["thresholds"] = verdict(evaluate(r, parse_thresholds(min_speedup="1.0:3")))
    return r


def test_registry_names():
    assert set(WRITERS) == {"json", "csv", "png", "html"}


def test_write_all_formats(tmp_path, report):
    out = write_reports(report, tmp_path / "out")
    assert set(out) == {"json", "csv", "png", "html"}
    assert all(p.exists() for p in out.values())
    assert {p.name for p in (tmp_path / "out").iterdir()} == ALL_FILES  # no temp files left


def test_json_round_trip(tmp_path, report):
    path = WRITERS["json"](report, tmp_path)
    text = path.read_text()
    assert "NaN" not in text and text.startswith("{\n  ")
    assert json.loads(text) == report


def test_csv_columns_and_rows(tmp_path, report):
    rows = list(csv.DictReader(WRITERS["csv"](report, tmp_path).open()))
    assert [r["name"] for r in rows] == ["b1_h0.00", "b1_h1.00", "b8_h0.50"]
    header = list(rows[0])
    assert header[:3] == ["name", "batch_size", "target_ratio"]
    assert header[-2:] == ["server_queue_ms", "server_compute_ms"]
    assert "server" not in header
    assert float(rows[1]["speedup"]) == pytest.approx(2.0)
    assert rows[1]["server_queue_ms"] == "0.25" and rows[0]["server_queue_ms"] == ""
    assert rows[2]["mean_ms"] == "" and rows[2]["requests"] == "0"
    assert header.index("ms_per_logical_request") == header.index("mean_ms") + 1
    assert float(rows[1]["ms_per_logical_request"]) == pytest.approx(0.5)  # 0.5 ms mean, one user a request
    assert rows[2]["ms_per_logical_request"] == ""


def test_html_stage_table_shows_ms_per_logical_request(report):
    page = render_html(report)
    stages = page[page.index("Stages: target vs achieved"):]
    assert "<th>ms per logical request</th>" in stages
    assert "<td>0.500</td>" in stages  # b1_h1.00: mean 0.5 ms over 1 user


def test_pngs_are_png_files(report):
    pngs = plots.render_plots(report)
    assert set(pngs) == set(plots.PLOT_NAMES)
    assert all(data.startswith(PNG_MAGIC) for data in pngs.values())


def test_plots_of_an_empty_run_still_render():
    empty = build_report(RunStats(), {})
    assert all(d.startswith(PNG_MAGIC) for d in plots.render_plots(empty).values())


def test_html_is_self_contained_and_escaped(report):
    page = render_html(report)
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page  # model and error reason
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg"') == 2  # the charts, inline
    assert "href=" not in page and "src=" not in page
    assert "2.00x" in page and "0.40" in page  # speed-up and p50 of b1_h1.00
    assert "FAILED" in page and "speed-up 2.00x &lt; 3x at hit ratio 1.00 (batch 1)" in page
    assert "queue_ms" in page and "compute_ms" in page


def test_html_file_draws_its_charts_without_plot_files(tmp_path, report):
    page = write_reports(report, tmp_path, formats=["html"])["html"].read_text()
    assert 'data-chart="latency"' in page and 'data-chart="speedup"' in page
    assert {p.name for p in tmp_path.iterdir()} == {"report.html"}


def test_without_matplotlib_png_is_skipped_and_html_keeps_its_charts(tmp_path, report, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert not plots.available()
    out = write_reports(report, tmp_path)
    assert isinstance(out["png"], str) and "matplotlib" in out["png"]
    page = out["html"].read_text()
    assert 'data-chart="latency"' in page and "2.00x" in page
    assert {p.name for p in tmp_path.iterdir()} == {"report.json", "report.csv", "report.html"}


def test_unknown_format_writes_nothing(tmp_path, report):
    with pytest.raises(ConfigError, match="'pdf'"):
        write_reports(report, tmp_path, formats=["json", "pdf"])
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(writers.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["report.json"]


def test_atomic_write_uses_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = atomic_write(tmp_path / "x", b"1")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
