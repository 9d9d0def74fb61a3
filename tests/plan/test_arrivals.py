import random
import statistics

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.plan.arrivals import ArrivalClock


def test_constant_rate_is_evenly_spaced_after_a_random_phase():
    clock = ArrivalClock("constant", 50.0, start=100.0, rng=random.Random(1))
    times = [clock.next() for _ in range(101)]
    assert 100.0 <= times[0] < 100.02
    assert all(b - a == pytest.approx(0.02) for a, b in zip(times, times[1:]))


def test_poisson_rate_has_exponential_gaps_of_the_right_mean():
    clock = ArrivalClock("poisson", 200.0, start=0.0, rng=random.Random(2))
    times = [clock.next() for _ in range(20_001)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.fmean(gaps) == pytest.approx(1 / 200, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 200, rel=0.05)  # exponential: sd == mean


def test_bad_arrivals_are_refused():
    with pytest.raises(ConfigError):
        ArrivalClock("bursty", 1.0, 0.0, random.Random())
    with pytest.raises(ConfigError):
        ArrivalClock("constant", 0.0, 0.0, random.Random())
