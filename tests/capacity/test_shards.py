"""The rule that makes one step of n servers out of its shards' measurements, by hand."""

from __future__ import annotations

import pytest

from hstu_replay.capacity.search import Measurement, Slo, judge
from hstu_replay.capacity.shards import combine, combined_ratio, spread


def _shard(p99: float, errors: float, rps: float, ratio: float, tokens: int, requests: int) -> Measurement:
    return Measurement(100.0, requests=requests, throughput_rps=rps, mean_ms=p99 / 2, p50_ms=p99 / 3, p99_ms=p99,
                       error_ratio=errors, achieved_ratio=ratio, history_tokens=tokens, hit_source="observed")


def test_the_worst_shard_for_the_slo_and_the_sum_for_throughput():
    a = _shard(p99=30.0, errors=0.0, rps=5.0, ratio=0.9, tokens=1_000, requests=100)
    b = _shard(p99=60.0, errors=0.02, rps=4.0, ratio=0.6, tokens=3_000, requests=300)
    step = combine([a, b])
    assert step.p99_ms == 60.0 and step.p50_ms == 20.0 and step.error_ratio == 0.02  # shard b's
    assert step.throughput_rps == 9.0 and step.requests == 400 and step.history_tokens == 4_000
    # (0.9 x 1,000 + 0.6 x 3,000) / 4,000 = 2,700 / 4,000
    assert step.achieved_ratio == pytest.approx(0.675)
    assert step.mean_ms == pytest.approx((15.0 * 100 + 30.0 * 300) / 400)  # 26.25
    assert not judge(step, Slo(p99_ms=50.0, error_ratio=0.05)).passed  # a meets it, b does not: the step fails
    assert judge(step, Slo(p99_ms=60.0, error_ratio=0.05)).passed
    assert combine([a]) is a


def test_unknown_figures_and_problems_are_not_hidden():
    a = _shard(30.0, 0.0, 5.0, 0.9, 1_000, 100)
    broken = Measurement(100.0, problem="timed out")
    step = combine([a, broken])
    assert step.p99_ms is None and step.throughput_rps is None and step.achieved_ratio is None
    assert step.problem == "timed out" and not judge(step, Slo(p99_ms=1e9)).passed
    assert combined_ratio([0.5, 0.25], [0, 0]) is None
    assert combined_ratio([0.5, 0.25], [1, 3]) == pytest.approx(0.3125)  # (0.5 + 0.75) / 4


def test_the_spread_of_the_shards():
    assert spread([0.7, None, 0.4, 0.55]) == {"min": 0.4, "max": 0.7, "shards": 3}
    assert spread([None]) is None


def test_a_step_of_n_servers_measures_its_shards_and_says_how_many(long_store, tmp_path):
    from hstu_replay.capacity.natural import NaturalPlan, curves, plan_capacity

    measured = []

    def run(plan, budget, servers, shard):  # no server: one is too slow, and so is shard 1 of 2
        measured.append((budget, servers, shard))
        p99 = {(1, 0): 60.0, (2, 1): 90.0}.get((servers, shard), 10.0 * servers)
        return _shard(p99, 0.0, 5.0, 0.5, 1_000, 50)

    lines = []
    plan = NaturalPlan(store=str(long_store), repository=str(tmp_path), out_dir=tmp_path,
                       slo=Slo(p99_ms=50.0), request_rate=10.0, budgets=(2_000,), max_servers=3)
    result = plan_capacity(plan, run, lines.append)
    assert measured == [(2_000, 1, 0), (2_000, 2, 0), (2_000, 2, 1), (2_000, 3, 0), (2_000, 3, 1), (2_000, 3, 2)]
    one, two, three = result["steps"]
    assert not two["passed"] and two["measured"]["p99_ms"] == 90.0  # one slow shard fails the step
    assert two["spread"]["measured_p99_ms"] == {"min": 20.0, "max": 90.0, "shards": 2}
    assert [s["shard"] for s in two["shards"]] == [0, 1] and two["shards_measured"] == 2
    assert result["answer"] == {"budget_tokens": 2_000, "servers": 3, "total_tokens": 6_000, "shards_measured": 3}
    offline = [c.ratio(2_000) for c in curves(plan)[3]]
    assert three["spread"]["curve_ratio"] == {"min": min(offline), "max": max(offline), "shards": 3}
    assert "shards measured 2 of 2; curve ratio over all 2 shards" in lines[2]

    measured.clear()
    capped = plan_capacity(NaturalPlan(**{**plan.__dict__, "shards_measured": 1, "max_servers": 2}), run, lines.append)
    assert measured == [(2_000, 1, 0), (2_000, 2, 0)] and capped["answer"]["shards_measured"] == 1
    assert capped["steps"][1]["spread"]["curve_ratio"]["shards"] == 2  # computed for all, measured for one
    assert "shards measured 1 of 2 (the others are assumed alike)" in lines[-1]
