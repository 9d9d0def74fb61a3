"""Dump replay: distinct users per request, hits from reused keys at 1.0, primes elsewhere."""

from __future__ import annotations

from hstu_replay.interface import Limits
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.dumps import DumpSource, pool_identities
from hstu_replay.plan.keys import KeyAllocator
from tests.plan.test_perf_analyzer import dump_pool

LIMITS = Limits(max_history=256)


def source_pair(users: int = 12, repeats: int = 2):
    p = dump_pool(users, repeats)
    dealer, held = Dealer(range(len(p)), identities=pool_identities(p)), {}
    return [DumpSource(p, dealer, held, KeyAllocator(0, i, nonce=3), LIMITS) for i in range(2)]


def test_a_request_never_carries_one_store_user_twice():
    a, b = source_pair()
    for _ in range(100):
        for source in (a, b):
            step = source.next_step(0.5, 8)
            ids = [u.user_id for u in step.request.users()]
            assert len(set(ids)) == 8, ids
            source.settle(step, True)


def test_full_hits_come_from_reused_keys_after_the_first_pass():
    a, b = source_pair()
    primes = []
    for _ in range(20):
        for source in (a, b):
            step = source.next_step(1.0, 4)
            primes.append(step.prime is not None)
            assert sum(step.expected_hits) == int(step.request.total_history_lengths.sum())
            source.settle(step, True)
    assert any(primes[:6]) and not any(primes[12:])  # 24 dumped users: primed once each, then reused


def test_a_failed_step_gives_up_its_keys():
    (a, _) = source_pair(users=4)
    first = a.next_step(1.0, 4)
    a.settle(first, True)
    again = a.next_step(1.0, 4)  # the other four dumped users: primed
    a.settle(again, False)
    keys_again = set(again.request.user_ids.tolist())
    for _ in range(4):
        step = a.next_step(1.0, 4)
        assert not keys_again & set(step.request.user_ids.tolist())  # never reused after the failure
        a.settle(step, True)


def test_a_dumped_user_in_flight_elsewhere_gets_a_fresh_key():
    a, b = source_pair(users=8, repeats=1)
    for source in (a, b):
        source.settle(source.next_step(1.0, 4), True)  # every dumped user's key holds its history
    step_a = a.next_step(1.0, 4)
    step_b = b.next_step(1.0, 4)  # a's four are in flight: b takes the other four
    assert not set(step_a.request.user_ids.tolist()) & set(step_b.request.user_ids.tolist())
    assert step_a.prime is None and step_b.prime is None
    step_c = a.next_step(1.0, 4)  # every dumped user in flight: shared users, fresh keys, primed
    assert step_c.prime is not None
    in_flight = set(step_a.request.user_ids.tolist()) | set(step_b.request.user_ids.tolist())
    assert not in_flight & set(step_c.request.user_ids.tolist())
