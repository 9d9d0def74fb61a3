"""capacity_throughput.svg and capacity_p99.svg from a hand-made capacity.json dict: points where
worked out by hand, breaches crossed, the offered rate and the SLO drawn."""

import xml.etree.ElementTree as ET

from hstu_replay.capacity import charts

NS = {"s": "http://www.w3.org/2000/svg"}


def _step(load, rps, p99, passed=True):
    return {"load": load, "throughput_rps": rps, "p99_ms": p99, "passed": passed,
            "breaches": [] if passed else [f"p99 {p99:.3f} ms > 100 ms"]}


def _data(kind="users", steps=(1, 2, 4, 8, 16)) -> dict:
    ratio = {"hit_ratio": 0.5, "pools": None,
             "steps": [_step(1, 10.0, 10.0), _step(4, 20.0, 100.0), _step(16, 40.0, 1000.0, passed=False)]}
    unit = "req/s offered" if kind == "rate" else "concurrent users"
    return {"load": {"kind": kind, "unit": unit, "steps": list(steps)}, "slo": {"p99_ms": 100.0}, "ratios": [ratio]}


def _circles(svg: str) -> list[tuple[str, str]]:
    return [(c.get("cx"), c.get("cy")) for c in ET.fromstring(svg).iterfind(".//s:circle[@class='point']", NS)]


def test_loads_spanning_sixteen_times_lie_on_a_log_axis():
    # x: 1 -> 72 px, 16 -> 432 px, 4 halfway (252); y 0..40 req/s over 272..36 px
    assert _circles(charts.throughput_chart(_data())) == [("72.0", "213.0"), ("252.0", "154.0"), ("432.0", "36.0")]


def test_p99_on_a_log_axis_with_the_slo_and_the_breach_crossed():
    svg = charts.p99_chart(_data())
    root = ET.fromstring(svg)
    # y ticks 10 .. 1000: two decades over 236 px, 100 ms halfway at 154 px
    assert _circles(svg) == [("72.0", "272.0"), ("252.0", "154.0"), ("432.0", "36.0")]
    assert root.find(".//s:line[@class='reference']", NS).get("y1") == "154.0"
    crosses = root.findall(".//s:path[@class='cross']", NS)
    assert len(crosses) == 2 and crosses[0].get("d").startswith("M427.0,31.0")  # the 16-user step, and the legend's
    assert "".join(root.find(".//s:g[@class='legend']", NS).itertext()) == \
        "hit ratio 0.50SLO p99 100 msSLO breached"


def test_an_offered_rate_is_drawn_beside_what_was_carried():
    root = ET.fromstring(charts.throughput_chart(_data("rate", (10, 20, 40))))
    offered = root.find(".//s:polyline[@data-metric='offered']", NS)
    assert offered.get("stroke-dasharray") and offered.get("points").count(",") == 3
    assert ET.fromstring(charts.throughput_chart(_data())).find(".//s:polyline[@data-metric='offered']", NS) is None


def test_a_result_without_steps_says_so():
    data = _data()
    data["ratios"][0]["steps"] = []
    for svg in charts.chart_files(data).values():
        root = ET.fromstring(svg)
        assert "no data" in "".join(root.itertext()) and root.find(".//s:polyline", NS) is None
