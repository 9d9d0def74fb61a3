"""The accountant files each sent request under its stage, with hand-worked figures."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.stats.accounting import Accountant, Outcome, Sent
from hstu_replay.stats.causes import ErrorCause
from hstu_replay.stats.run_stats import BinKey, RunStats
from hstu_replay.verify import Verdict

STAGE = BinKey(2, 0.5)


class _Request:
    """The three fields of RequestTensors the accountant reads."""

    def __init__(self, totals):
        self.total_history_lengths = np.array(totals, dtype=np.int64)
        self.user_ids = np.arange(len(totals), dtype=np.int64) + 100
        self.batch_size = len(totals)


def send(acc, kind, totals, predicted, outcome, expected=None):
    acc.file(Sent(kind, STAGE, _Request(totals), expected or (0,) * len(totals), predicted, outcome, "x", 0))


class _Records(list):
    def write(self, record):
        self.append(record)


def test_primes_measured_and_wrong_answers_land_in_the_stage():
    stats, records = RunStats(), _Records()
    acc = Accountant(stats, records, worker_index=1)
    send(acc, "prime", (50, 30), (0, 0), Outcome(0.01))
    send(acc, "measure", (100, 60), (50, 30), Outcome(0.02), expected=(50, 30))
    send(acc, "measure", (100, 60), (100, 60), Outcome(0.02, cached_tokens=np.array([100, 40])))
    bad = Outcome(0.03, verdict=Verdict(False, 1.0, 0), mismatch="mismatch in x")
    send(acc, "measure", (200, 60), (0, 0), bad)
    send(acc, "measure", (200, 60), (0, 0), Outcome(0.03, error="timeout"))
    send(acc, "warmup", (10, 10), (0, 0), Outcome(0.01))
    b = stats.bins[STAGE]
    assert (b.prime_requests, b.prime_tokens) == (1, 80)
    assert (b.requests, b.errors, b.mismatches, b.failures) == (3, 1, 1, 2)  # a wrong answer fails
    assert b.history_tokens == 160 + 160 + 260
    # computed: 160-80 (predicted) + 160-140 (observed wins) + 260
    assert b.computed_tokens == 80 + 20 + 260
    assert (b.observed_hits, b.observed_tokens, b.hit_disagreements, b.hits_lost) == (140, 160, 1, 1)
    assert b.hit_source == "predicted"  # not every measured request carried a server report
    assert stats.warmup_requests == 1
    assert stats.errors == {"mismatch in x": ErrorCause(1, "mismatch in x"), "timeout": ErrorCause(1, "timeout")}
    assert [r["kind"] for r in records] == ["prime", "measure", "measure", "measure", "measure", "warmup"]
    assert records[1]["keys"] == [100, 101] and records[1]["worker"] == 1
    assert records[3]["mismatch"] is True


def test_a_failed_prime_is_counted_with_its_reason():
    stats = RunStats()
    send(Accountant(stats, None, 0), "prime", (50,), (0,), Outcome(0.01, error="unavailable"))
    assert stats.bins[STAGE].prime_failures == 1 and stats.bins[STAGE].prime_tokens == 0
    assert stats.errors == {"prime: unavailable": ErrorCause(1, "prime: unavailable")}


@pytest.mark.parametrize("reports", [True, False])
def test_the_achieved_ratio_names_its_source(reports):
    stats = RunStats()
    cached = np.array([30]) if reports else None
    send(Accountant(stats, None, 0), "measure", (100,), (50,), Outcome(0.01, cached_tokens=cached))
    b = stats.bins[STAGE]
    assert (b.hit_source, b.achieved_ratio) == (("observed", 0.3) if reports else ("predicted", 0.5))


def test_an_outage_is_timed_in_the_stage_it_began_and_opens_a_new_epoch():
    from hstu_replay.stats.availability import Availability

    said, stats = [], RunStats()
    availability = Availability(stats, said.append)
    assert not availability.answered(now=1.0)  # answers while up change nothing
    availability.refused(STAGE, now=10.0)
    availability.refused(BinKey(2, 0.9), now=11.0)  # still the same outage
    assert availability.down and availability.epoch == 0
    assert availability.answered(now=22.5)
    assert stats.bins[STAGE].server_down_s == 12.5 and availability.epoch == 1
    assert len(said) == 2 and "after 12.5 s" in said[1]


def test_users_are_counted_by_tier_predicted_and_observed():
    stats = RunStats()
    acc = Accountant(stats, None, worker_index=0)
    observed = Outcome(0.01, cached_tokens=np.array([10, 0, 0, 7]), host_cached_tokens=np.array([10, 0, 0, 0]))
    for _ in range(2):
        acc.file(Sent("measure", STAGE, _Request((20, 20, 20, 20)), (0,) * 4, (10, 0, 5, 7), observed, "x", 0,
                      predicted_host_hits=(0, 0, 5, 0)))
    b = stats.bin(STAGE)
    # by hand, per request: predicted users 0 and 3 reuse from the GPU, 2 from the host, 1 nothing;
    # observed: user 0 onboarded from the host, 3 from the GPU, 1 and 2 nothing
    assert (b.predicted_gpu_users, b.predicted_host_users, b.predicted_miss_users) == (4, 2, 2)
    assert (b.observed_gpu_users, b.observed_host_users, b.observed_miss_users) == (2, 2, 4)
    assert (b.predicted_host_hits, b.observed_host_hits) == (10, 20)


def test_a_fleet_request_lands_in_its_stage_and_in_its_server():
    stats = RunStats()
    acc = Accountant(stats, None, 0)
    for server, totals, hits in ((0, (100,), [100]), (1, (60,), [0]), (1, (40,), [40])):
        acc.file(Sent("measure", STAGE, _Request(totals), (0,), tuple(hits), Outcome(0.01, cached_tokens=np.array(hits)),
                      "x", 0, server=server))
    acc.file(Sent("measure", STAGE, _Request((10,)), (0,), (0,), Outcome(0.01, error="refused"), "x", 0, server=1))
    whole, first, second = stats.bins[STAGE], stats.servers[STAGE, 0], stats.servers[STAGE, 1]
    assert (whole.requests, first.requests, second.requests) == (3, 1, 2)
    assert (first.observed_ratio, second.observed_ratio, whole.observed_ratio) == (1.0, 0.4, 0.7)
    assert (whole.errors, first.errors, second.errors) == (1, 0, 1)
    assert stats.errors == {"refused": ErrorCause(1, "refused")}  # counted once, not once per bin
    again = RunStats.from_dict(stats.to_dict())  # as a worker's report carries it to the master
    assert again.servers[STAGE, 1].requests == 2 and again.servers[STAGE, 1].observed_hits == 40
    merged = RunStats()
    merged.merge(stats)
    merged.merge(again)
    assert merged.servers[STAGE, 1].requests == 4


def test_an_outage_of_a_fleet_server_is_counted_on_it_and_at_the_end_even_if_it_goes_on():
    from hstu_replay.stats.availability import Availability

    stats = RunStats()
    availability = Availability(stats, lambda _: None, server=2, name="127.0.0.1:9001")
    availability.refused(STAGE, now=5.0)
    availability.settle(now=9.0)  # the run ends with the server still away
    assert stats.bins[STAGE].server_down_s == 4.0 and stats.servers[STAGE, 2].server_down_s == 4.0
    assert availability.down and availability.epoch == 0
    assert availability.answered(now=10.0)  # only the rest is added
    assert stats.servers[STAGE, 2].server_down_s == 5.0
