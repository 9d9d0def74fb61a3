"""The protocol's tables against hand-worked passes and NVIDIA's own printed ratios."""

import pytest

from hstu_replay.protocol import published
from hstu_replay.protocol.passes import PassResult, mean_pass
from hstu_replay.protocol.tables import build_protocol_report, flags, render_text


def _pass(model, batch, name, e2e_s, calls=10, cached=None, history=1000, server_calls=None, mismatches=0):
    return PassResult(model=model, batch_size=batch, name=name, calls=calls, e2e_s=e2e_s, wire_s=e2e_s * 0.9,
                      history_tokens=history, cached_tokens=cached, verified=calls, mismatches=mismatches,
                      max_abs_diff=0.5 if mismatches else 0.001,
                      server_calls=calls if server_calls is None else server_calls)


KV = "hstu_gr_ranking_kvcache"
PASSES = [
    _pass("hstu_model", 2, "repeat 1", 0.9), _pass("hstu_model", 2, "repeat 2", 1.0),
    _pass("hstu_model", 2, "repeat 3", 1.1),
    _pass(KV, 2, "cold", 0.8, cached=0), _pass(KV, 2, "cached", 0.4, cached=1000),
    _pass(KV, 8, "cold", 0.64, calls=4, cached=0), _pass(KV, 8, "cached", 0.16, calls=4, cached=1000),
]


def test_latency_per_logical_request_is_e2e_over_calls_times_batch():
    # 0.8 s for 10 calls of 2 users: 800 ms / 20 = 40 ms
    assert PASSES[3].ms_per_logical_request == pytest.approx(40.0)
    assert PASSES[3].logical_requests == 20
    assert PASSES[6].ms_per_logical_request == pytest.approx(160 / 32)  # 0.16 s, 4 calls x 8 users


def test_mean_of_repeats():
    m = mean_pass(PASSES[:3])
    assert m.name == "mean of 3" and m.e2e_s == pytest.approx(1.0) and m.calls == 10
    assert m.verified == 30 and m.server_calls == 10


def test_backend_comparison_by_hand():
    r = build_protocol_report(PASSES, {"hardware": "test box"}, backend_batch=2)
    rows = {row["label"]: row for row in r["backend_comparison"]["rows"]}
    assert "no-cache model" not in rows  # hstu_gr_ranking was not measured: no row, no estimate
    python = rows["Python-backend interface, no cache"]["ours"]
    cold = rows["KV-cache model, pass 1 (nothing cached)"]["ours"]
    hit = rows["KV-cache model, pass 2 (all cached)"]["ours"]
    assert python["e2e_s"] == pytest.approx(1.0) and python["ms_per_logical_request"] == pytest.approx(50.0)
    assert cold["speedup_vs_python"] == pytest.approx(1.25)  # 1.0 / 0.8
    assert hit["speedup_vs_python"] == pytest.approx(2.5) and hit["speedup_vs_no_cache"] == pytest.approx(2.0)
    assert hit["cached_fraction"] == 1.0 and cold["cached_fraction"] == 0.0


def test_nvidia_ratios_match_what_nvidia_printed():
    # the write-up prints 1.23x, 1.63x over Python and 1.32x over AOTI no cache for these seconds
    r = build_protocol_report(PASSES, {}, backend_batch=2)
    nvidia = [row["nvidia"] for row in r["backend_comparison"]["rows"] if row["nvidia"]]
    assert [round(n["speedup_vs_python"], 2) for n in nvidia] == [1.0, 1.23, 1.63]
    assert round(nvidia[2]["speedup_vs_no_cache"], 2) == 1.32
    assert r["hardware"] == {"ours": None, "nvidia": published.HARDWARE}


def test_batch_scaling_by_hand_with_published_points_at_batch_8():
    r = build_protocol_report(PASSES, {}, backend_batch=2)
    rows = {row["batch_size"]: row for row in r["batch_scaling"]["rows"]}
    assert rows[2]["no_cache_ms"] == pytest.approx(40.0) and rows[2]["hit_ms"] == pytest.approx(20.0)
    assert rows[8]["no_cache_ms"] == pytest.approx(20.0) and rows[8]["hit_ms"] == pytest.approx(5.0)
    assert rows[8]["speedup"] == pytest.approx(4.0)
    assert rows[2]["nvidia"] == []
    by_layers = {n["layers"]: n for n in rows[8]["nvidia"]}
    assert by_layers[3]["hit_ms"] == 0.423 and by_layers[8]["speedup"] == 5.93
    assert by_layers[3]["no_cache_ms_derived"] == pytest.approx(0.423 * 4.47)
    text = render_text(r)
    assert "0.423" in text and "4.000x" not in text and "4.00x" in text


def test_flags_name_what_is_wrong():
    bad = [
        _pass(KV, 2, "cold", 0.8, cached=10),  # something was cached in the cold pass
        _pass(KV, 2, "cached", 0.4, cached=900),  # 90%: evicted
        _pass(KV, 4, "cold", 0.5, server_calls=12),  # other traffic
        _pass(KV, 4, "cached", 0.2, cached=1000, mismatches=2),
        _pass("hstu_model", 2, "repeat 1", 2.0), _pass("hstu_model", 2, "repeat 2", 1.0),
    ]
    found = flags(bad)
    assert len(found) == 5
    assert "reused 1.0% of the history in the cold pass" in found[1]
    assert "reused only 90.0%" in found[2]
    assert "counted 12 requests" in found[3]
    assert "2 of 10 answers differ" in found[4]
    assert "1 .. 2 s" in found[0]
    assert flags(PASSES) == []
