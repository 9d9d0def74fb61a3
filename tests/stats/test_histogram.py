import math
import random

import numpy as np
import pytest

from hstu_replay.stats.histogram import LatencyHistogram, bucket_bounds, bucket_of


def test_small_values_are_exact():
    h = LatencyHistogram.of([0.001, 0.002, 0.003, 0.004])  # 1..4 ms
    assert h.percentile_ms(50) == 2.0
    assert h.percentile_ms(100) == 4.0
    assert h.mean_ms == pytest.approx(2.5)


def test_bucket_bounds_contain_their_values():
    for v in [0, 1, 2047, 2048, 2049, 4095, 4096, 10**6, 123_456_789]:
        low, high = bucket_bounds(bucket_of(v))
        assert low <= v < high
        assert high - low == 1 if v < 2048 else (high - low) / v <= 1 / 1024


def test_percentiles_within_a_tenth_of_a_percent_of_the_nearest_rank():
    rng = random.Random(3)
    values = [rng.lognormvariate(math.log(0.02), 1.0) for _ in range(20_000)]
    h = LatencyHistogram.of(values)
    ordered = np.sort(np.round(np.array(values) * 1e6)) / 1e3
    # nearest rank ceil(q/100 x n), in integers: per mille, so 99.9% of 20,000 is rank 19,980
    # (numpy's inverted_cdf takes 19,981: 0.999 x 20000 is 19980.000000000004 in floats)
    for per_mille in (500, 900, 990, 999):
        exact = ordered[-(-per_mille * len(values) // 1000) - 1]
        assert h.percentile_ms(per_mille / 10) == pytest.approx(exact, rel=1.1e-3)


def test_merge_equals_recording_everything_in_one():
    a, b = [0.001 * i for i in range(1, 50)], [0.0137 * i for i in range(1, 70)]
    merged = LatencyHistogram.of(a)
    merged.merge(LatencyHistogram.from_dict(LatencyHistogram.of(b).to_dict()))
    whole = LatencyHistogram.of(a + b)
    assert merged == whole
    assert merged.percentile_ms(99) == whole.percentile_ms(99)


def test_empty_histogram_reports_nan():
    assert math.isnan(LatencyHistogram().percentile_ms(50))
    assert math.isnan(LatencyHistogram().mean_ms)


def test_percentile_confidence_interval_from_order_statistics():
    # 1,000 samples of 1..1000 us: the median's 95% interval is the 469th and 532nd values
    # (500 -+ 1.96 x sqrt(1000 x 0.5 x 0.5) = 469.01 .. 530.99, upper rank + 1); below 2.048 ms
    # the histogram is exact.
    h = LatencyHistogram.of(i / 1e6 for i in range(1, 1001))
    assert h.percentile_interval_ms(50) == (0.469, 0.532)
    # 30 samples cannot bound p99 from above: the upper rank (31) lies past the samples
    low, high = LatencyHistogram.of(i / 1e6 for i in range(1, 31)).percentile_interval_ms(99)
    assert low == 0.028 and math.isnan(high)
