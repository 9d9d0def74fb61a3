import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.report.thresholds import Thresholds, evaluate, parse_thresholds, verdict


def _bin(batch, ratio, p99=10.0, speedup=None, requests=100, failures=0, mismatches=0):
    """`failures` requests got no answer; `mismatches` of the answered `requests` were wrong."""
    return {"name": f"b{batch}_h{ratio:.2f}", "batch_size": batch, "target_ratio": ratio, "p99_ms": p99,
            "speedup": speedup, "requests": requests, "errors": failures, "failures": failures + mismatches}


def _report(bins, mismatches=0):
    return {"bins": bins, "stages": [], "verification": {"verified": 10, "mismatches": mismatches,
                                           "tolerance": 0.0625}}


# -- parsing ----------------------------------------------------------------------------------

def test_parse_all_empty_means_no_thresholds():
    t = parse_thresholds()
    assert t == Thresholds() and t.empty
    assert parse_thresholds("", "", "", "").empty


def test_parse_values():
    t = parse_thresholds("0", "0.01", "0:300, 1.0:120", "1.0:1.5,0.9:1.3")
    assert t.max_mismatches == 0 and t.max_error_ratio == 0.01
    assert t.max_p99_ms == {0.0: 300.0, 1.0: 120.0}
    assert t.min_speedup == {1.0: 1.5, 0.9: 1.3}
    assert not t.empty


def test_parse_bare_p99_means_every_bin_and_mixes_with_ratios():
    assert parse_thresholds(max_p99_ms="250").max_p99_ms == {None: 250.0}
    assert parse_thresholds(max_p99_ms="250,1:100").max_p99_ms == {None: 250.0, 1.0: 100.0}
    assert parse_thresholds(max_mismatches=3).max_mismatches == 3


@pytest.mark.parametrize("kwargs, option, bad", [
    ({"max_mismatches": "many"}, "--max-mismatches", "many"),
    ({"max_mismatches": "-1"}, "--max-mismatches", "-1"),
    ({"max_mismatches": "1.5"}, "--max-mismatches", "1.5"),
    ({"max_error_ratio": "two"}, "--max-error-ratio", "two"),
    ({"max_error_ratio": "1.5"}, "--max-error-ratio", "1.5"),
    ({"max_p99_ms": "fast"}, "--max-p99-ms", "fast"),
    ({"max_p99_ms": "0:"}, "--max-p99-ms", "0:"),
    ({"max_p99_ms": "1.5:100"}, "--max-p99-ms", "1.5:100"),
    ({"max_p99_ms": "0:-3"}, "--max-p99-ms", "0:-3"),
    ({"max_p99_ms": "0:100,,1:50"}, "--max-p99-ms", "0:100,,1:50"),
    ({"max_p99_ms": "0:100,0.0:50"}, "--max-p99-ms", "0:100,0.0:50"),
    ({"max_p99_ms": "nan"}, "--max-p99-ms", "nan"),
    ({"min_speedup": "1.5"}, "--min-speedup", "1.5"),
    ({"min_speedup": "x:1.5"}, "--min-speedup", "x:1.5"),
    ({"min_speedup": "1.0:1.5:2"}, "--min-speedup", "1.0:1.5:2"),
])
def test_parse_malformed_names_option_and_text(kwargs, option, bad):
    with pytest.raises(ConfigError) as e:
        parse_thresholds(**kwargs)
    assert option in str(e.value) and bad in str(e.value)


# -- evaluation -------------------------------------------------------------------------------

def test_nothing_set_passes_anything():
    assert evaluate(_report([_bin(1, 0.0, p99=None)], mismatches=9), Thresholds()) == []


def test_mismatches():
    t = parse_thresholds(max_mismatches=0)
    assert evaluate(_report([], mismatches=3), t) == ["3 mismatches > 0 allowed"]
    assert evaluate(_report([], mismatches=0), t) == []


def test_error_ratio_over_all_bins():
    # 1 + 3 failures of 100 + 1 + 25 + 3 = 129 sent: 0.031
    bins = [_bin(1, 0.0, requests=100, failures=1), _bin(1, 1.0, requests=25, failures=3)]
    assert evaluate(_report(bins), parse_thresholds(max_error_ratio="0.01")) == [
        "error ratio 0.031 > 0.01"]
    assert evaluate(_report(bins), parse_thresholds(max_error_ratio="0.05")) == []
    assert evaluate(_report([]), parse_thresholds(max_error_ratio="0.05")) == [
        "no measured requests for --max-error-ratio"]


def test_wrong_answers_count_as_failures():
    # 4 of 100 answered requests were wrong, none unanswered: 4 / 100, not 4 / 104
    bins = [_bin(1, 0.0, requests=100, mismatches=4)]
    assert evaluate(_report(bins), parse_thresholds(max_error_ratio="0.03")) == ["error ratio 0.040 > 0.03"]


def test_p99_all_bins_and_specific_ratio_overrides():
    bins = [_bin(8, 0.0, p99=280.0), _bin(8, 0.5, p99=612.34), _bin(8, 1.0, p99=100.0)]
    assert evaluate(_report(bins), parse_thresholds(max_p99_ms="250")) == [
        "p99 280.0 ms > 250 ms in bin b8_h0.00", "p99 612.3 ms > 250 ms in bin b8_h0.50"]
    assert evaluate(_report(bins), parse_thresholds(max_p99_ms="250,0:300,0.5:700")) == []
    assert evaluate(_report(bins), parse_thresholds(max_p99_ms="1.0:90")) == [
        "p99 100.0 ms > 90 ms in bin b8_h1.00"]


def test_p99_missing_bin_and_missing_latencies_are_violations():
    bins = [_bin(1, 0.0, p99=None)]
    assert evaluate(_report(bins), parse_thresholds(max_p99_ms="0:100,0.75:50")) == [
        "no bin at hit ratio 0.75 for --max-p99-ms",
        "no latencies in bin b1_h0.00 for --max-p99-ms"]


def test_min_speedup():
    bins = [_bin(1, 0.0, speedup=1.0), _bin(1, 1.0, speedup=2.0),
            _bin(8, 0.0, speedup=1.0), _bin(8, 1.0, speedup=1.2), _bin(16, 1.0)]
    assert evaluate(_report(bins), parse_thresholds(min_speedup="1.0:1.5,0.75:1.1")) == [
        "speed-up 1.20x < 1.5x at hit ratio 1.00 (batch 8)",
        "speed-up unknown at hit ratio 1.00 (batch 16): needs latencies here and in a 0.00 bin",
        "no bin at hit ratio 0.75 for --min-speedup"]


def test_ratio_matching_tolerates_float_noise():
    bins = [_bin(1, 0.1 + 0.2, p99=500.0)]  # 0.30000000000000004
    assert evaluate(_report(bins), parse_thresholds(max_p99_ms="0.3:100")) == [
        "p99 500.0 ms > 100 ms in bin b1_h0.30"]


def test_verdict():
    assert verdict([]) == {"passed": True, "violations": [], "checked": []}
    assert verdict(iter(["x"]), ["p99 <= 250 ms"]) == {"passed": False, "violations": ["x"], "checked": ["p99 <= 250 ms"]}


def test_each_limit_set_reads_in_words():
    t = parse_thresholds(max_mismatches=0, max_error_ratio="0.01", max_p99_ms="250,1.0:120", min_speedup="0.9:1.3",
                         max_workers_lost=1)
    assert t.described() == ["mismatches <= 0", "error ratio <= 0.01", "p99 <= 250 ms", "p99 <= 120 ms at hit ratio 1.00",
                             "speed-up >= 1.3x at hit ratio 0.90", "workers lost <= 1"]
    assert Thresholds().described() == [] and Thresholds().empty and not t.empty
