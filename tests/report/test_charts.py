"""A run's SVG charts, checked against hand-worked pixel positions and parsed as XML."""

import xml.etree.ElementTree as ET

import pytest

from hstu_replay.output.chart import COLORS
from hstu_replay.report import charts

NS = {"s": "http://www.w3.org/2000/svg"}


def _bin(name, batch, achieved, p50=None, p99=None, speedup=None):
    return {"name": name, "batch_size": batch, "achieved_ratio": achieved, "p50_ms": p50, "p99_ms": p99,
            "speedup": speedup}


@pytest.fixture
def report() -> dict:
    # batch 1 listed out of order; batch 8's stage measured nothing yet
    return {"bins": [_bin("b1_h1.00", 1, 1.0, 5.0, 8.0, 2.0), _bin("b1_h0.00", 1, 0.0, 10.0, 20.0, 1.0),
                     _bin("b8_h0.50", 8, None)]}


def _points(chart: str) -> list[dict]:
    root = ET.fromstring(chart)  # well-formed XML, or this raises
    return [c.attrib for c in root.iter("{http://www.w3.org/2000/svg}circle")]


def test_series_per_batch_by_ratio_without_empty_bins(report):
    assert charts.series(report, "p50_ms") == {1: [charts.Point("b1_h0.00", 0.0, 10.0), charts.Point("b1_h1.00", 1.0, 5.0)]}


def test_latency_points_sit_where_worked_out_by_hand(report):
    points = _points(charts.latency_chart(report))
    # x: ratio 0 -> 64 + 8 = 72 px, ratio 1 -> 440 - 8 = 432 px; y: 0..20 ms over 272..36 px (236 px)
    by_key = {(p["data-stage"], p["data-metric"]): (p["cx"], p["cy"]) for p in points}
    assert by_key == {
        ("b1_h0.00", "p50_ms"): ("72.0", "154.0"),  # 272 - 10/20 * 236
        ("b1_h0.00", "p99_ms"): ("72.0", "36.0"),
        ("b1_h1.00", "p50_ms"): ("432.0", "213.0"),  # 272 - 5/20 * 236
        ("b1_h1.00", "p99_ms"): ("432.0", "177.6"),  # 272 - 8/20 * 236
    }


def test_points_carry_exact_values_and_a_tooltip():
    report = {"bins": [_bin("b2_h0.33", 2, 0.3333333333333333, 12.345678901234567, 20.1, None)]}
    root = ET.fromstring(charts.latency_chart(report))
    circle = root.find(".//s:circle[@data-metric='p50_ms']", NS)
    assert float(circle.get("data-x")) == 0.3333333333333333
    assert float(circle.get("data-y")) == 12.345678901234567
    assert circle.find("s:title", NS).text == "b2_h0.33: batch 2, achieved hit ratio 0.333, p50 ms 12.35"


def test_p99_is_dashed_and_each_batch_has_its_colour():
    report = {"bins": [_bin("b1_h0.00", 1, 0.0, 1.0, 2.0), _bin("b8_h0.00", 8, 0.0, 3.0, 4.0)]}
    root = ET.fromstring(charts.latency_chart(report))
    lines = {(ln.get("data-batch"), ln.get("data-metric")): ln for ln in root.iterfind(".//s:polyline", NS)}
    assert lines[("1", "p99_ms")].get("stroke-dasharray") and not lines[("1", "p50_ms")].get("stroke-dasharray")
    assert lines[("1", "p50_ms")].get("stroke") == lines[("1", "p99_ms")].get("stroke") == COLORS[0]
    assert lines[("8", "p50_ms")].get("stroke") == COLORS[1]
    legend = "".join(root.find(".//s:g[@class='legend']", NS).itertext())
    assert legend == "batch 1batch 8p50 msp99 ms"


def test_speedup_marks_one_x(report):
    root = ET.fromstring(charts.speedup_chart(report))
    # speed-ups 1 and 2: ticks 0, 0.5 .. 2; 1x at 272 - 1/2 * 236 = 154 px
    assert root.find(".//s:line[@class='reference']", NS).get("y1") == "154.0"
    assert [(p["data-stage"], p["cy"]) for p in _points(charts.speedup_chart(report))] == [
        ("b1_h0.00", "154.0"), ("b1_h1.00", "36.0")]


def test_an_empty_run_draws_axes_and_says_so():
    drawn = charts.charts({"bins": [_bin("b1_h0.00", 1, None)]})
    y_ticks = {"latency": ["0", "1"], "speedup": ["0", "0.2", "0.4", "0.6", "0.8", "1"]}  # speed-up reaches 1x
    assert [ET.fromstring(c).get("data-chart") for c in drawn] == list(y_ticks)
    for chart in drawn:
        root = ET.fromstring(chart)
        axes = root.find("s:g[@class='axes']", NS)
        labels = [t.text for t in axes.findall("s:text", NS)]
        expected = y_ticks[root.get("data-chart")]
        # the frame, a grid line and a label at each y tick and at the five x ticks 0 .. 1
        assert labels[:len(expected) + 5] == [*expected, "0", "0.25", "0.5", "0.75", "1"]
        assert axes.find("s:rect", NS) is not None and len(axes.findall("s:line", NS)) == len(expected) + 5
        assert _points(chart) == [] and root.find(".//s:polyline", NS) is None
        assert "no measured stage yet" in "".join(root.itertext())


def test_names_are_escaped():
    evil = "b1_<script>&\""
    chart = charts.latency_chart({"bins": [_bin(evil, 1, 0.5, 1.0, 2.0)]})
    assert "<script>" not in chart
    assert {p["data-stage"] for p in _points(chart)} == {evil}


def test_a_flagged_stage_is_ringed_and_named():
    flagged = dict(_bin("b1_h0.50", 1, 0.4, 7.0, 9.0, 1.5), flags=["thin", "off-target"])
    report = {"bins": [dict(_bin("b1_h0.00", 1, 0.0, 10.0, 20.0, 1.0), flags=[]), flagged]}
    root = ET.fromstring(charts.latency_chart(report))
    points = {(c.get("data-stage"), c.get("data-metric")): c for c in root.iterfind(".//s:circle[@class='point']", NS)}
    rings = {(c.get("cx"), c.get("cy")) for c in root.iterfind(".//s:circle[@class='flag-ring']", NS)}
    assert {k: c.get("data-flags") for k, c in points.items()} == {
        ("b1_h0.00", "p50_ms"): "", ("b1_h0.00", "p99_ms"): "",
        ("b1_h0.50", "p50_ms"): "thin,off-target", ("b1_h0.50", "p99_ms"): "thin,off-target"}
    assert rings == {(points["b1_h0.50", m].get("cx"), points["b1_h0.50", m].get("cy")) for m in ("p50_ms", "p99_ms")}
    assert points["b1_h0.50", "p50_ms"].find("s:title", NS).text.endswith("p50 ms 7.00 (flagged: thin, off-target)")
    assert "flagged stage" in "".join(root.find(".//s:g[@class='legend']", NS).itertext())


def test_the_latency_file_adds_the_mean_dotted(report):
    report = {"bins": [dict(b, mean_ms=b["p50_ms"], throughput_rps=None) for b in report["bins"]]}
    root = ET.fromstring(charts.chart_files(report)[charts.LATENCY_SVG])
    lines = {ln.get("data-metric"): ln for ln in root.iterfind(".//s:polyline", NS)}
    assert set(lines) == {"p50_ms", "p99_ms", "mean_ms"}
    assert lines["mean_ms"].get("stroke-dasharray") != lines["p99_ms"].get("stroke-dasharray")
    assert "".join(root.find(".//s:g[@class='legend']", NS).itertext()) == "batch 1p50 msp99 msmean ms"


def test_the_throughput_file_draws_req_per_s():
    report = {"bins": [dict(_bin("b1_h0.00", 1, 0.0), throughput_rps=40.0),
                       dict(_bin("b1_h1.00", 1, 1.0), throughput_rps=80.0)]}
    root = ET.fromstring(charts.throughput_chart(report))
    # y ticks 0 .. 80 by 20: 40 req/s at 272 - 40/80 * 236 = 154 px, 80 at 36 px
    assert [(p["data-stage"], p["cx"], p["cy"]) for p in _points(ET.tostring(root, encoding="unicode"))] == [
        ("b1_h0.00", "72.0", "154.0"), ("b1_h1.00", "432.0", "36.0")]
