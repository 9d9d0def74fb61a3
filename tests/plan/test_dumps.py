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


def test_partial_ratios_from_reuse_send_no_primes_and_reach_the_ratio_in_tokens():
    """--partial-hits reuse: each dumped user is a full hit on the key it filled, or cold on a fresh key;
    the hit tokens over the tokens sent, worked out here from the requests themselves, stay at the target."""
    from hstu_replay.interface import history_tokens
    from hstu_replay.plan.reuse import HitMix

    p = dump_pool(12, 2)
    dealer, held, mix = Dealer(range(len(p)), identities=pool_identities(p)), {}, HitMix()
    a, b = (DumpSource(p, dealer, held, KeyAllocator(0, i, nonce=3), LIMITS, mix) for i in range(2))
    filled: dict[int, int] = {}  # key -> history tokens it holds, by this test's own book
    hit = sent = 0
    for n in range(60):
        for source in (a, b):
            step = source.next_step(0.5, 4)
            assert step.prime is None
            for user, expected in zip(step.request.users(), step.expected_hits):
                tokens = history_tokens(user.history_length)
                assert expected == (tokens if filled.get(user.key) == tokens else 0)  # a full hit or nothing
                filled[user.key] = tokens
                if n >= 10:  # past the first pass over the dumped users (every key cold)
                    hit, sent = hit + expected, sent + tokens
            source.settle(step, True)
    assert abs(hit / sent - 0.5) < 0.02
    # the same pool at 0.5 by priming: a prime with every request
    primed = DumpSource(p, Dealer(range(len(p)), identities=pool_identities(p)), {}, KeyAllocator(0, 3), LIMITS)
    assert all(primed.next_step(0.5, 4).prime is not None for _ in range(5))


def test_partial_hits_reuse_leaves_zero_and_one_as_they_were():
    from hstu_replay.plan.reuse import HitMix

    p = dump_pool(8, 1)
    source = DumpSource(p, Dealer(range(len(p)), identities=pool_identities(p)), {}, KeyAllocator(0, 0), LIMITS,
                        HitMix())
    for _ in range(4):
        step = source.next_step(0.0, 4)
        assert step.prime is None and sum(step.expected_hits) == 0
        source.settle(step, True)
    full = [source.next_step(1.0, 4) for _ in range(2)]  # every key holds its user's history: full hits
    assert all(s.prime is None and sum(s.expected_hits) == int(s.request.total_history_lengths.sum()) for s in full)


def test_known_answers_are_the_first_dumped_users_in_order_each_on_a_fresh_key():
    import numpy as np
    from dataclasses import replace

    from hstu_replay.plan.dumps import known_answers

    pool = [replace(d, reference=np.full((8, 8), i, dtype=np.float32)) for i, d in enumerate(dump_pool(users=7))]
    keys = KeyAllocator(0, 4095, nonce=5)
    answers = known_answers(pool, 3, 2, keys, LIMITS)
    assert [a.labels for a in answers] == [("batch 0 user 0", "batch 0 user 1", "batch 0 user 2"),
                                           ("batch 0 user 3", "batch 0 user 4", "batch 0 user 5")]
    assert [[u.user_id for u in a.request.users()] for a in answers] == [[500, 501, 502], [503, 504, 505]]
    sent = [int(k) for a in answers for k in a.request.user_ids]
    assert len(set(sent)) == 6 and all(k >> 23 & (2**20 - 1) == 4095 for k in sent)  # the slot's own keys
    assert answers[1].reference[:, 0].tolist() == [3] * 8 + [4] * 8 + [5] * 8  # each user's rows, in order
    assert len(known_answers(pool, 4, 5, keys, LIMITS)) == 2  # 7 users: a batch of 4, then one of 3
    assert known_answers(dump_pool(users=4), 2, 2, keys, LIMITS) == []  # a dump without logits
