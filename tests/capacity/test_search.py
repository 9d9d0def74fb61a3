"""The capacity search on hand-worked numbers: SLO verdicts, stepping, sustainable, knee, fleet size."""

from __future__ import annotations

import pytest

from hstu_replay.capacity.search import (
    Measurement, Slo, breaches, knee, servers_needed, slo_crossing, step_until_breach, summarize, sustainable,
)

SLO = Slo(p99_ms=100.0, error_ratio=0.01)


def m(load, rps, mean_ms, p99_ms, error_ratio=0.0, batch=1) -> Measurement:
    return Measurement(load=load, requests=100, throughput_rps=rps, logical_throughput=rps * batch,
                       mean_ms=mean_ms, p50_ms=mean_ms, p99_ms=p99_ms, error_ratio=error_ratio)


# load -> (req/s, mean ms, p99 ms); power = req/s / mean s: 200, 300, 240, 130, 100
CURVE = {1: m(1, 10, 50, 80), 2: m(2, 18, 60, 90), 4: m(4, 24, 100, 99), 8: m(8, 26, 200, 250),
         16: m(16, 26, 260, 400)}


def search(curve=CURVE, slo=SLO):
    asked = []

    def measure(load):
        asked.append(load)
        return curve[load]

    return step_until_breach(sorted(curve), measure, slo), asked


def test_power_is_throughput_over_mean_latency_in_seconds():
    assert CURVE[2].power == pytest.approx(18 / 0.060)
    assert Measurement(load=1).power is None
    assert m(1, 10, 0, 1).power is None


def test_stepping_stops_at_the_first_breach_and_keeps_it():
    steps, asked = search()
    assert asked == [1, 2, 4, 8]  # 16 is never run
    assert [s.passed for s in steps] == [True, True, True, False]
    assert steps[-1].breaches == ("p99 250.000 ms > 100 ms",)


def test_every_load_passing_runs_every_step():
    steps, asked = search(slo=Slo(p99_ms=1000.0))
    assert asked == [1, 2, 4, 8, 16] and all(s.passed for s in steps)
    assert summarize(0.0, steps, None).stopped_at is None


def test_sustainable_is_the_passing_step_of_highest_throughput():
    steps, _ = search()
    assert sustainable(steps).load == 4  # 24 req/s; 26 req/s at 8 breached the SLO
    bumpy = {1: m(1, 20, 50, 60), 2: m(2, 30, 60, 70), 4: m(4, 25, 90, 95)}
    assert sustainable(search(bumpy)[0]).load == 2  # not simply the last passing step


def test_knee_is_the_step_of_maximum_power():
    steps, _ = search()
    assert knee(steps).load == 2  # powers 200, 300, 240, 130


def test_knee_may_lie_past_the_slo_and_says_so():
    curve = {1: m(1, 10, 100, 90), 2: m(2, 40, 100, 120)}  # powers 100, 400
    steps, _ = search(curve)
    k = knee(steps)
    assert k.load == 2 and not k.passed
    assert sustainable(steps).load == 1


def test_servers_needed_rounds_up():
    assert servers_needed(100.0, 24.0) == 5  # 4.17 -> 5
    assert servers_needed(96.0, 24.0) == 4  # exactly 4
    assert servers_needed(1.1, 0.1) == 11  # 11.000000000000002 in floats: still 11
    assert servers_needed(1.0, 24.0) == 1
    assert servers_needed(None, 24.0) is None
    assert servers_needed(100.0, None) is None
    assert servers_needed(100.0, 0.0) is None


def test_servers_needed_uses_logical_throughput():
    steps, _ = search({1: m(1, 10, 50, 80, batch=8), 2: m(2, 12, 80, 95, batch=8)})  # 80 and 96 logical/s
    result = summarize(0.5, steps, target_rps=1000.0)
    assert result.sustainable.load == 2
    assert result.servers_needed == 11  # ceil(1000 / 96)


def test_no_passing_step_gives_none():
    steps, asked = search({1: m(1, 10, 150, 300), 2: m(2, 12, 160, 320)})
    assert asked == [1]
    result = summarize(1.0, steps, target_rps=100.0)
    assert result.sustainable is None and result.servers_needed is None
    assert result.stopped_at.load == 1
    assert result.knee.load == 1  # still measured: the curve has a (breaching) knee


def test_error_ratio_breaks_the_slo():
    assert breaches(m(1, 10, 50, 80, error_ratio=0.02), SLO) == ("error ratio 0.0200 > 0.01",)
    assert breaches(m(1, 10, 50, 80, error_ratio=0.01), SLO) == ()  # at the limit is within it
    both = breaches(m(1, 10, 50, 180, error_ratio=0.5), SLO)
    assert len(both) == 2


def test_a_step_without_figures_breaks_the_slo():
    assert breaches(Measurement(load=1), SLO) == ("no request was measured",)
    assert breaches(Measurement(load=1, problem="timed out after 30 s"), SLO) == ("timed out after 30 s",)
    assert breaches(Measurement(load=1, requests=0, p99_ms=1.0), SLO) == ("no request was measured",)


def test_on_step_sees_every_step_in_order():
    seen = []
    step_until_breach([1, 2, 4, 8, 16], CURVE.__getitem__, SLO, seen.append)
    assert [s.load for s in seen] == [1, 2, 4, 8]


def test_the_slo_crossing_lies_on_the_line_between_the_last_pass_and_the_breach():
    steps, _ = search()  # 4 users: p99 99 ms (passes), 8 users: 250 ms (breaks 100 ms)
    assert slo_crossing(steps, SLO) == pytest.approx(4 + (100 - 99) * (8 - 4) / (250 - 99))  # 4.026
    assert slo_crossing(search({1: m(1, 10, 50, 40), 2: m(2, 18, 60, 60), 4: m(4, 20, 90, 130)})[0],
                        SLO) == pytest.approx(2 + 40 * 2 / 70)
    assert slo_crossing(search({1: m(1, 10, 50, 80), 2: m(2, 18, 60, 90)})[0], SLO) is None  # never broke
    assert slo_crossing(search({1: m(1, 10, 50, 180)})[0], SLO) is None  # no step passed
    errors = {1: m(1, 10, 50, 80), 2: m(2, 18, 60, 90, error_ratio=0.5)}  # broke by errors, p99 within the SLO
    assert slo_crossing(search(errors)[0], SLO) is None
