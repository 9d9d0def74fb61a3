"""Session replay keeps each target hit ratio through a sweep, whatever the visits' lengths."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.keys import KeyAllocator, key_owner
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.sessions import SessionSource, usable_users

SWEEP = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


@pytest.mark.parametrize("max_history", [64, 256])
def test_a_sweep_at_batch_1_achieves_every_target(long_store, max_history):
    store = SequenceStore.open(long_store)
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16,
                           Limits(max_history=max_history))
    for target in SWEEP:  # one source through the whole sweep, as a Locust user runs it
        hits = tokens = 0
        for _ in range(400):
            step = source.next_step(target, 1)
            hits += sum(step.expected_hits)
            tokens += int(step.request.total_history_lengths.sum())
        assert hits / tokens == pytest.approx(target, abs=0.03), (target, hits / tokens)


def test_slots_of_a_batch_and_users_of_a_process_replay_different_users(long_store):
    # Each slot used to advance by one through one order, and each virtual user was the same
    # order shifted by one: 62 of 200 batch-4 requests held one store user twice.
    store = SequenceStore.open(long_store)
    dealer = Dealer(usable_users(store, 16), seed=0)
    sources = [SessionSource(store, dealer, KeyAllocator(0, i, nonce=1), 16, Limits(max_history=256))
               for i in range(2)]
    for _ in range(200):
        for source in sources:
            step = source.next_step(0.5, 4)
            users = [u.user_id for u in step.request.users()]
            assert len(set(users)) == 4, users
    held = [slot.user for source in sources for slot in source._slots]
    assert len(set(held)) == len(held) == 8  # 16 users in the store: no two slots share one


class _History:
    def __init__(self, user_id: int, events: int):
        self.user_id, self.context = user_id, (1, 1, 1, 1, 1)
        self.video_ids = np.arange(1, events + 1, dtype=np.int64) + user_id * 10_000
        self.actions = np.ones(events, dtype=np.int64)
        self.times_ms = np.zeros(events, dtype=np.int64)  # one long visit: a key jumps to the cap


class _LongStore:
    """Eight users of 5,000 events each, more than the published 4,096-item limit."""

    def __init__(self):
        self.users = [_History(u + 1, 5000) for u in range(8)]

    def __len__(self):
        return len(self.users)

    def user(self, index):
        return self.users[index]


@pytest.mark.parametrize("target", [0.0, 0.5, 0.9, 1.0])
def test_batch_8_at_default_limits_fits_max_values(target):
    # With --max-history 4096 and --max-values 40000, batch 8 used to raise
    # "request has 40642 values; the model takes at most 40000" on every step.
    store, limits = _LongStore(), Limits()
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16, limits)
    longest = 0
    for _ in range(50):
        step = source.next_step(target, 8)
        assert len(step.request.values) <= limits.max_values
        assert step.prime is None or len(step.prime.values) <= limits.max_values
        longest = max(longest, max(u.history_length for u in step.request.users()))
    assert longest == limits.history_cap(8, 16) == 2481  # capped, and the cap is reached


def test_a_key_names_the_worker_and_user_that_made_it():
    keys = KeyAllocator(3, 17)
    assert {key_owner(keys.new_key()) for _ in range(5)} == {(3, 17)}


def steered_mix(store_path, mix, batch: int, gpu: int, host: int, steps: int, target: float = 0.5,
                sources: int = 1):
    """Replay steered sources as Locust users do (the model predicts each request as it is sent), and
    count the tier each measured user met in the oracle's separately written two-tier cache."""
    from hstu_replay.plan.cache_model import CacheModel
    from hstu_replay.plan.sessions import TierSteering
    from hstu_replay.plan.tier_mix import TierMix
    from tests.oracle.server import TwoTierCache

    store = SequenceStore.open(store_path)
    model = CacheModel(gpu, 32, host)
    oracle = TwoTierCache(gpu, host, 32)
    dealer = Dealer(usable_users(store, 16))
    steering = TierSteering(TierMix.parse(mix), model)
    users = [SessionSource(store, dealer, KeyAllocator(0, i, nonce=3), 16, Limits(max_history=64), steering)
             for i in range(sources)]
    counts = {"gpu": 0, "host": 0, "miss": 0}
    ratios = []
    for i in range(steps):
        source = users[i % sources]
        step = source.next_step(target, batch)
        for request in (step.prime, step.request):
            if request is None:
                continue
            predicted = model.predict_tiers(request)
            keys, totals = request.user_ids.tolist(), request.total_history_lengths.tolist()
            hits = oracle.apply(keys, totals)
            assert predicted.hits == tuple(hits) and predicted.host == tuple(oracle.last_host_hits)
        if i >= steps // 2:  # the first half warms the working set up
            for hit, onboarded, total in zip(hits, oracle.last_host_hits, totals):
                counts["host" if onboarded else "gpu" if hit else "miss"] += 1
                if hit:
                    ratios.append(hit / total)
        model.retire(source.settle(step, True))
    n = sum(counts.values())
    return {k: v / n for k, v in counts.items()}, ratios


@pytest.mark.parametrize("mix, batch, sources, target", [
    ("gpu:0.6,host:0.3,miss:0.1", 1, 1, 0.5), ("gpu:0.6,host:0.3,miss:0.1", 4, 3, 0.5),
    ("gpu:0.2,host:0.7,miss:0.1", 2, 2, 0.8), ("host:0.9,miss:0.1", 1, 1, 0.9)])
def test_a_steered_replay_meets_its_tier_mix_in_the_oracle_cache(long_store, mix, batch, sources, target):
    from hstu_replay.plan.tier_mix import TierMix

    achieved, ratios = steered_mix(long_store, mix, batch, gpu=3000, host=9000, steps=1200, target=target,
                                   sources=sources)
    wanted = TierMix.parse(mix).as_dict()
    assert max(abs(achieved[t] - wanted[t]) for t in wanted) <= 0.02, achieved
    assert abs(sum(ratios) / len(ratios) - target) < 0.02  # hits reuse the stage's ratio of their history


def test_host_hits_need_fresh_keys_a_mix_of_host_alone_falls_short(long_store):
    """Each fresh key (a GPU hit or a miss) can take a few host hits before it reaches the history limit
    (at 0.5 its history doubles per hit): without enough of them the host share falls short, into misses."""
    achieved, _ = steered_mix(long_store, "host:1", 1, gpu=3000, host=9000, steps=1200, target=0.5)
    assert achieved["host"] < 0.9 and achieved["gpu"] == 0.0


class _CountingStore:
    """The real store, counting the user reads (each builds memory-map views: the cost a slot saves)."""

    def __init__(self, store):
        self.store, self.reads = store, 0

    def __len__(self):
        return len(self.store)

    def user(self, index):
        self.reads += 1
        return self.store.user(index)


def test_a_slot_reads_its_user_from_the_store_once_and_sends_what_the_store_holds(long_store):
    store = SequenceStore.open(long_store)
    counting = _CountingStore(store)
    source = SessionSource(counting, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16,
                           Limits(max_history=256))
    taken = 0
    for _ in range(300):
        step = source.next_step(0.5, 4)
        for slot in step.handles:
            taken += slot.sent == 0  # never: a slot's fresh user has sent its first visit by now
        for u in step.request.users():  # against the store itself, read separately
            i = store.index_of(u.user_id)
            history = store.user(i)
            n = u.history_length
            np.testing.assert_array_equal(u.history_items, history.video_ids[:n])
            np.testing.assert_array_equal(u.history_actions, history.actions[:n].astype(np.int64))
            np.testing.assert_array_equal(u.candidates, history.video_ids[n:n + 16])
        source.settle(step, True)
    assert taken == 0
    assert 4 <= counting.reads < 300  # once per user a slot takes, not several times per step


def test_at_1_0_a_warm_step_is_the_same_request_and_a_failed_one_is_not(long_store):
    store = SequenceStore.open(long_store)
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16,
                           Limits(max_history=256))
    first = source.next_step(1.0, 4)
    source.settle(first, True)
    second = source.next_step(1.0, 4)
    source.settle(second, True)
    third = source.next_step(1.0, 4)
    assert third.request is second.request and third.prime is None and third.label == second.label
    assert sum(third.expected_hits) == int(third.request.total_history_lengths.sum())  # a full hit
    source.settle(third, False)  # its keys' state is unknown: fresh keys, a new request and primes
    fourth = source.next_step(1.0, 4)
    assert fourth.request is not third.request and fourth.prime is not None
    assert set(fourth.request.user_ids.tolist()).isdisjoint(third.request.user_ids.tolist())
    at_zero = [source.next_step(0.0, 4) for _ in range(2)]
    assert at_zero[0].request is not at_zero[1].request


def test_a_fresh_history_ends_where_the_next_visit_of_the_users_whole_log_ends_or_at_the_limit(long_store):
    """Visit boundaries worked out here from each user's whole log (a gap of 60 s or more), though a
    slot reads only the times its requests can reach: at hit ratio 0 each request of a slot's user
    is a fresh key whose history ends at the first boundary past the previous one, or at the most
    the user can send."""
    store = SequenceStore.open(long_store)
    limits = Limits(max_history=256)
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16, limits)
    cap, last, checked = limits.history_cap(4, 16), {}, 0
    for _ in range(200):
        step = source.next_step(0.0, 4)
        for u in step.request.users():
            times = np.asarray(store.user(store.index_of(u.user_id)).times_ms, dtype=np.int64)
            boundaries = np.flatnonzero(np.diff(times) >= 60_000) + 1
            before = last.get(u.user_id, 0)
            if u.history_length <= before:  # the user taken again, from its start
                before = 0
            later = boundaries[boundaries > before]
            expected = min(int(later[0]) if len(later) else len(times), min(len(times) - 16, cap))
            assert u.history_length == expected, (u.user_id, before, u.history_length, expected)
            last[u.user_id], checked = u.history_length, checked + 1
        source.settle(step, True)
    assert checked == 800
