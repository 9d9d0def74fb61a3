"""The SVG chart kit: ticks, linear and log axes, step lines, marks and the legend, checked
against hand-worked pixel positions and parsed as XML."""

import xml.etree.ElementTree as ET

import pytest

from hstu_replay.output import chart
from hstu_replay.output.chart import Axis, Key, Point, Reference, Series

NS = {"s": "http://www.w3.org/2000/svg"}


@pytest.mark.parametrize("top, ticks", [
    (20.0, [0, 5, 10, 15, 20]),  # steps of 1, 2, 2.5 need more than 5; 5 reaches 20 in 4
    (23.24, [0, 5, 10, 15, 20, 25]),
    (1.37, [0, 0.5, 1.0, 1.5]),
    (0.7, [0, 0.2, 0.4, 0.6, 0.8]),
    (49.0, [0, 10, 20, 30, 40, 50]),
    (0.0, [0, 1]),
])
def test_nice_ticks(top, ticks):
    assert chart.nice_ticks(top) == pytest.approx(ticks)


@pytest.mark.parametrize("low, high, ticks", [
    (3.0, 40.0, [1, 2, 5, 10, 20, 50, 100]),
    (10.0, 10.0, [10, 20, 50, 100]),  # one value: its decade
    (0.5, 2000.0, [0.1, 1, 10, 100, 1000, 10000]),  # past three decades: powers of ten alone
])
def test_log_ticks(low, high, ticks):
    assert chart.log_ticks(low, high) == pytest.approx(ticks)


def _draw(x: Axis, y: Axis, series, references=(), legend=()) -> ET.Element:
    return ET.fromstring(chart.chart("t", "a title", x, y, series, legend, references))


def test_a_log_axis_puts_each_decade_the_same_distance_apart():
    x = Axis("load", 1.0, 16.0, [1, 2, 4, 8, 16], log=True, inset=8)
    y = Axis("ms", 1.0, 100.0, [1, 10, 100], log=True)
    points = [Point(1, 1, "a"), Point(4, 10, "b"), Point(16, 100, "c")]
    root = _draw(x, y, [Series("red", points)])
    # x: 1 -> 64 + 8 = 72 px, 16 -> 440 - 8 = 432 px, 4 halfway (log 4 = log 16 / 2); y: 1 -> 272, 10 -> 154, 100 -> 36
    assert [(c.get("cx"), c.get("cy")) for c in root.iterfind(".//s:circle", NS)] == [
        ("72.0", "272.0"), ("252.0", "154.0"), ("432.0", "36.0")]
    assert [t.text for t in root.find("s:g[@class='axes']", NS).findall("s:text", NS)][:8] == [
        "1", "10", "100", "1", "2", "4", "8", "16"]


def test_a_log_axis_leaves_out_what_it_cannot_place():
    y = Axis("ms", 1.0, 100.0, [1, 10, 100], log=True)
    root = _draw(Axis("x", 0, 1, [0, 1]), y, [Series("red", [Point(0, 0.0, "zero"), Point(1, 10, "ten")])])
    assert [c.find("s:title", NS).text for c in root.iterfind(".//s:circle", NS)] == ["ten"]


def test_a_step_line_goes_flat_then_up():
    x, y = Axis("x", 0, 10, [0, 10]), Axis("y", 0, 1, [0, 1])
    root = _draw(x, y, [Series("blue", [Point(0, 0, ""), Point(5, 0.5, ""), Point(10, 1, "")], steps=True,
                               dots=False)])
    # x 0, 5, 10 -> 64, 252, 440 px; y 0, 0.5, 1 -> 272, 154, 36 px
    assert root.find(".//s:polyline", NS).get("points") == \
        "64.0,272.0 252.0,272.0 252.0,154.0 440.0,154.0 440.0,36.0"
    assert root.find(".//s:circle", NS) is None


def test_marks_references_and_the_legend():
    x, y = Axis("x", 0, 10, [0, 10]), Axis("y", 0, 10, [0, 10])
    series = [Series("blue", [Point(5, 5, "ok", {"load": "5"}), Point(10, 10, "broke", crossed=True, ringed=True)],
                     {"ratio": "h0.5"}, dash=chart.DASHED),
              Series("grey", [Point(0, 0, "x"), Point(10, 10, "x")], line=True, dots=False)]
    root = _draw(x, y, series, [Reference(5.0, "red", chart.DASHED)],
                 [[Key("h0.5", "blue", width=6)], [Key("limit", "red", chart.DASHED)],
                  [Key("broke", chart.MARK_COLOR, cross=True)]])
    line = root.find(".//s:polyline[@data-ratio='h0.5']", NS)
    assert line.get("stroke-dasharray") == chart.DASHED
    assert [c.get("data-load") for c in root.iterfind(".//s:circle[@class='point']", NS)] == ["5", None]
    assert [c.get("cx") for c in root.iterfind(".//s:circle[@class='flag-ring']", NS)] == ["440.0"]
    crosses = root.findall(".//s:path[@class='cross']", NS)
    assert len(crosses) == 2 and crosses[0].get("d").startswith("M435.0,31.0")  # at (440, 36) and in the legend
    assert root.find(".//s:line[@class='reference']", NS).get("y1") == "154.0"
    assert "".join(root.find(".//s:g[@class='legend']", NS).itertext()) == "h0.5limitbroke"


def test_nothing_to_draw_says_so_and_draws_no_legend():
    root = _draw(Axis("x", 0, 1, [0, 1]), Axis("y", 0, 1, [0, 1]), [Series("blue", [])], [Reference(0.5)],
                 [[Key("nothing")]])
    assert "no data" in "".join(root.itertext())
    assert root.find(".//s:g[@class='legend']", NS) is None and root.find(".//s:line[@class='reference']", NS) is None


def test_a_standalone_file_is_an_svg_document():
    svg = chart.chart("t", "<a & b>", Axis("x", 0, 1, [0, 1]), Axis("y", 0, 1, [0, 1]), [], [])
    data = chart.standalone(svg)
    assert data.startswith(b"<?xml") and ET.fromstring(data).tag == "{http://www.w3.org/2000/svg}svg"
    assert "&lt;a &amp; b&gt;" in svg
