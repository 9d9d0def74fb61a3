import csv
import json
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.report import charts
from hstu_replay.report.html import render_html
from hstu_replay.report.summary import build_report
from hstu_replay.report.thresholds import evaluate, parse_thresholds, verdict
from hstu_replay.report.writers import WRITERS, write_reports
from hstu_replay.stats.causes import ErrorCause
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

SVG = "{http://www.w3.org/2000/svg}svg"
ALL_FILES = {"report.json", "report.csv", "report.html", *charts.CHART_NAMES}
EVIL = "<script>alert('x')</script>"


def _bin(ms, **kw) -> BinStats:
    return BinStats(latency=LatencyHistogram.of(m / 1e3 for m in ms), requests=len(ms),
                    first_start=0.0, last_end=2.0, **kw)


@pytest.fixture
def report() -> dict:
    stats = RunStats(errors={EVIL: ErrorCause(1, EVIL), "timeout": ErrorCause(4, "timeout")})
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
    assert set(WRITERS) == {"json", "csv", "svg", "html"}


def test_write_all_formats(tmp_path, report):
    out = write_reports(report, tmp_path / "out")
    assert set(out) == {"json", "csv", "svg", "html"}
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
    # b1_h0.00: 1 of 5 sent got no answer, a thin stage of 4; b1_h1.00: 4 answers verified, none wrong
    assert (rows[0]["errors"], rows[0]["mismatches"], json.loads(rows[0]["flags"])) == ("1", "0", ["errors", "thin"])
    assert (rows[1]["errors"], rows[1]["mismatches"], json.loads(rows[1]["flags"])) == ("0", "0", ["thin"])


def test_html_stage_table_shows_ms_per_logical_request(report):
    page = render_html(report)
    stages = page[page.index("Stages: target vs achieved"):]
    assert "<th>ms per logical request</th>" in stages
    assert "<td>0.500</td>" in stages  # b1_h1.00: mean 0.5 ms over 1 user


def test_chart_files_are_svg_documents(tmp_path, report):
    write_reports(report, tmp_path, formats=["svg"])
    assert {p.name for p in tmp_path.iterdir()} == set(charts.CHART_NAMES)
    roots = {name: ET.parse(tmp_path / name).getroot() for name in charts.CHART_NAMES}
    assert all(root.tag == SVG for root in roots.values())
    # b1_h1.00's p50 (0.40 ms, the histogram's midpoint) is a point of the latency file, exactly as report.json has it
    b = report["bins"][1]
    points = {(c.get("data-stage"), c.get("data-metric")): float(c.get("data-y"))
              for c in roots[charts.LATENCY_SVG].iter("{http://www.w3.org/2000/svg}circle") if c.get("data-stage")}
    assert points[(b["name"], "p50_ms")] == b["p50_ms"] and points[(b["name"], "mean_ms")] == b["mean_ms"]


def test_charts_of_an_empty_run_still_render(tmp_path):
    empty = build_report(RunStats(), {})
    write_reports(empty, tmp_path, formats=["svg"])
    assert all(ET.parse(tmp_path / name).getroot().tag == SVG for name in charts.CHART_NAMES)


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


def test_without_matplotlib_every_file_is_written(tmp_path, report, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    out = write_reports(report, tmp_path)
    page = out["html"].read_text()
    assert 'data-chart="latency"' in page and "2.00x" in page
    assert {p.name for p in tmp_path.iterdir()} == ALL_FILES


def test_unknown_format_writes_nothing(tmp_path, report):
    with pytest.raises(ConfigError, match="'pdf'"):
        write_reports(report, tmp_path, formats=["json", "pdf"])
    assert list(tmp_path.iterdir()) == []
