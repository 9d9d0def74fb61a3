"""The tiers section of a stage, from hand-worked counters."""

from __future__ import annotations

import math

import pytest

from hstu_replay.report.flags import StageRules, stage_flags
from hstu_replay.report.summary import build_report
from hstu_replay.report.tier_section import shows_tiers, stage_tiers, tier_table
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats


def stats(observed: bool) -> BinStats:
    # 10 users, 1,000 history tokens: 6 GPU hits (300 tokens), 3 host hits (200 tokens), 1 miss
    s = BinStats(requests=10, logical_requests=10, history_tokens=1000, predicted_hits=500, predicted_host_hits=200,
                 predicted_gpu_users=6, predicted_host_users=3, predicted_miss_users=1)
    if observed:  # the server saw one host hit less: a GPU hit instead (50 tokens more from the GPU)
        s.observed_hits, s.observed_tokens, s.observed_host_hits, s.observed_tier_tokens = 500, 1000, 150, 1000
        s.observed_gpu_users, s.observed_host_users, s.observed_miss_users = 7, 2, 1
    return s


def one_tier() -> BinStats:
    """A stage against a server that reports tiers but holds no host tier: every hit from the GPU."""
    return BinStats(requests=10, logical_requests=10, history_tokens=1000, predicted_hits=500, predicted_gpu_users=10,
                    observed_hits=500, observed_tokens=1000, observed_tier_tokens=1000, observed_gpu_users=10)


def test_the_model_figures_without_a_server_report():
    t = stage_tiers(stats(False), {"gpu": 0.6, "host": 0.3, "miss": 0.1})
    assert t["source"] == "predicted" and t["observed"] is None
    assert (t["gpu_ratio"], t["host_ratio"]) == (0.3, 0.2)
    assert t["mix"] == {"gpu": 0.6, "host": 0.3, "miss": 0.1} and t["mix_distance"] == 0.0


def test_the_servers_word_where_it_sends_host_cached_tokens():
    t = stage_tiers(stats(True), {"gpu": 0.6, "host": 0.3, "miss": 0.1})
    assert t["source"] == "observed" and (t["gpu_ratio"], t["host_ratio"]) == (0.35, 0.15)
    assert t["mix"] == {"gpu": 0.7, "host": 0.2, "miss": 0.1}
    assert math.isclose(t["mix_distance"], 0.1) and t["predicted"]["mix"]["gpu"] == 0.6
    flags = stage_flags(BinKey(1, 0.5), stats(True), StageRules(min_requests=1, tier_mix=(("gpu", 0.6), ("host", 0.3),
                                                                                           ("miss", 0.1))))
    assert [f["flag"] for f in flags] == ["off-target"] and "0.100 from its target" in flags[0]["reason"]
    assert not stage_flags(BinKey(1, 0.5), stats(False), StageRules(min_requests=1, tier_mix=(("gpu", 0.6),
                                                                                              ("host", 0.3),
                                                                                              ("miss", 0.1))))


def test_the_table_beside_the_hit_ratios():
    run_stats = RunStats({BinKey(1, 0.5): stats(True)})
    report = build_report(run_stats, {"options": {"host_budget_tokens": 9000, "tier_mix": "gpu:0.6,host:0.3,miss:0.1"}},
                          rules=StageRules(tier_mix=(("gpu", 0.6), ("host", 0.3), ("miss", 0.1))))
    assert shows_tiers(report) and not shows_tiers({"run": {"options": {}}})
    untiered = build_report(RunStats({BinKey(1, 0.5): one_tier()}), {"options": {}, "reports_tiers": True})
    assert not shows_tiers(untiered)  # a server that reports tiers, no host tier and no host hit
    hosted = build_report(run_stats, {"options": {}, "reports_tiers": True})
    assert shows_tiers(hosted)  # host hits seen without a host budget given (a server that has one)
    header, row = tier_table(report)
    assert header[:8] == ["batch", "target", "gpu hit", "host hit", "from", "mix gpu", "mix host", "mix miss"]
    assert row[:9] == ["1", "0.5", "0.350", "0.150", "server", "0.700", "0.200", "0.100", "gpu:0.6,host:0.3,miss:0.1"]


def test_the_html_report_shows_the_tiers_beside_the_hit_ratios():
    import re

    from hstu_replay.report.html import render_html

    report = build_report(RunStats({BinKey(1, 0.5): stats(True)}),
                          {"options": {"host_budget_tokens": 9000, "tier_mix": "gpu:0.6,host:0.3,miss:0.1"}},
                          rules=StageRules(tier_mix=(("gpu", 0.6), ("host", 0.3), ("miss", 0.1))))
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", render_html(report)))
    assert "Cache tiers: GPU hit, host hit, miss" in text
    assert "1 0.5 0.350 0.150 server 0.700 0.200 0.100 gpu:0.6,host:0.3,miss:0.1" in text
    plain = build_report(RunStats({BinKey(1, 0.5): one_tier()}), {"options": {}, "reports_tiers": True})
    assert "Cache tiers" not in render_html(plain)


def tiered_report() -> dict:
    return build_report(RunStats({BinKey(1, 0.5): stats(True)}),
                        {"options": {"host_budget_tokens": 9000, "tier_mix": "gpu:0.6,host:0.3,miss:0.1"}},
                        rules=StageRules(tier_mix=(("gpu", 0.6), ("host", 0.3), ("miss", 0.1))))


def test_report_csv_carries_the_tier_columns_where_the_run_has_tiers():
    import csv
    import io

    from hstu_replay.report.writers import report_csv

    (row,) = csv.DictReader(io.StringIO(report_csv(tiered_report())))
    header = list(row)
    assert header[header.index("tier_source"):header.index("tier_mix_distance") + 1] == [
        "tier_source", "tier_gpu_ratio", "tier_host_ratio", "tier_mix_gpu", "tier_mix_host", "tier_mix_miss",
        "tier_target_mix", "tier_mix_distance"]
    # 10 users: 7 GPU, 2 host, 1 miss by the server; 350 + 150 of 1,000 history tokens
    assert (row["tier_source"], row["tier_target_mix"]) == ("observed", "gpu:0.6,host:0.3,miss:0.1")
    figures = [float(row[k]) for k in ("tier_gpu_ratio", "tier_host_ratio", "tier_mix_gpu", "tier_mix_host",
                                       "tier_mix_miss", "tier_mix_distance")]
    assert figures == [0.35, 0.15, 0.7, 0.2, 0.1, pytest.approx(0.1)]
    plain = build_report(RunStats({BinKey(1, 0.5): one_tier()}), {"options": {}, "reports_tiers": True})
    assert not [k for k in next(csv.reader(io.StringIO(report_csv(plain)))) if k.startswith("tier_")]
