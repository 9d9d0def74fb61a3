"""A working set revisited round-robin: by hand, with G GPU and H host tokens and T tokens (whole
pages) per key, a cyclic LRU order gives all GPU hits while N*T <= G, host hits while N*T <= H
(NVIDIA's flexkv inclusion: the host holds copies of the GPU's keys too), misses beyond; checked
against the oracle server's separately written two-tier cache, with the client model's expected
hits equal to what the oracle found on every request."""

from __future__ import annotations

import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.plan.cache_model import CacheModel
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.sessions import usable_users
from hstu_replay.plan.working_set import WorkingSetSource, working_set_plan
from tests.oracle.server import TwoTierCache

PAGE = 32
ITEMS = 58  # 6 + 2 * 58 = 122 tokens: 4 pages, T = 128 in whole pages
T = 128
GPU, HOST = 8 * T, 20 * T  # the GPU pool holds 8 keys, the host pool 20


def hand_worked(n: int) -> str:
    return "gpu" if n * T <= GPU else "host" if n * T <= HOST else "miss"


def replay(store_path, size: int, batch: int, cycles: int = 4) -> tuple[dict[str, int], int]:
    store = SequenceStore.open(store_path)
    limits = Limits(max_history=ITEMS)
    items, users = working_set_plan(store, size, (batch,), limits, 16, Dealer(usable_users(store, 16)).order)
    assert items == ITEMS and len(users) == size
    model = CacheModel(GPU, PAGE, HOST, offload_mode="flexkv")
    oracle = TwoTierCache(GPU, HOST, PAGE, offload_mode="flexkv")
    source = WorkingSetSource(store, users, items, KeyAllocator(0, 0, nonce=7), 16, limits, model)
    counts = {"gpu": 0, "host": 0, "miss": 0}
    keys_seen = set()
    for step_index in range(cycles * size // batch):
        step = source.next_step(1.0, batch)
        assert step.prime is None and len(set(step.request.user_ids.tolist())) == batch
        predicted = model.predict_tiers(step.request)
        keys, totals = step.request.user_ids.tolist(), step.request.total_history_lengths.tolist()
        assert set(totals) == {6 + 2 * ITEMS}
        hits = oracle.apply(keys, totals)
        assert predicted.hits == tuple(hits) and predicted.host == tuple(oracle.last_host_hits)
        assert step.expected_hits == tuple(hits)  # what the source expected, the oracle found
        keys_seen.update(keys)
        if step_index >= size // batch:  # the first cycle sends every key cold
            for hit, onboarded in zip(hits, oracle.last_host_hits):
                counts["host" if onboarded else "gpu" if hit else "miss"] += 1
        assert source.settle(step, True) == []
    return counts, len(keys_seen)


@pytest.mark.parametrize("size", [2, 4, 8, 10, 16, 20, 22, 40])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_cyclic_working_set_meets_the_hand_worked_tier(long_store, size, batch):
    counts, distinct = replay(long_store, size, batch)
    assert distinct == size  # N keys, each revisited
    expected = hand_worked(size)
    assert counts[expected] == sum(counts.values()) == 3 * size, (size, counts)


def test_the_first_cycle_is_cold_and_a_failed_step_or_a_reset_sends_fresh_keys(long_store):
    store = SequenceStore.open(long_store)
    limits = Limits(max_history=ITEMS)
    items, users = working_set_plan(store, 4, (2,), limits, 16, Dealer(usable_users(store, 16)).order)
    source = WorkingSetSource(store, users, items, KeyAllocator(0, 0, nonce=7), 16, limits)
    first = [source.next_step(1.0, 2) for _ in range(2)]
    assert [s.expected_hits for s in first] == [(0, 0), (0, 0)]
    again = source.next_step(1.0, 2)
    assert again.expected_hits == (122, 122)
    assert again.request.user_ids.tolist() == first[0].request.user_ids.tolist()
    assert sorted(source.settle(again, False)) == sorted(again.request.user_ids.tolist())
    assert source.next_step(1.0, 2).expected_hits == (122, 122)  # the other half was fine
    fresh = source.next_step(1.0, 2)
    assert fresh.expected_hits == (0, 0)
    assert set(fresh.request.user_ids.tolist()).isdisjoint(first[0].request.user_ids.tolist())
    source.reset()
    assert len(source.settle(fresh, True)) == 4 and source.next_step(1.0, 2).expected_hits == (0, 0)


@pytest.mark.parametrize("size, batches, max_history, says", [
    (0, (1,), 58, "give a number of keys"),
    (6, (4,), 58, "multiple of every batch size"),
    (4, (4,), 4000, "lower --max-history"),
])
def test_a_working_set_that_cannot_be_replayed_is_refused(long_store, size, batches, max_history, says):
    store = SequenceStore.open(long_store)
    with pytest.raises(ConfigError, match=says):
        working_set_plan(store, size, batches, Limits(max_history=max_history), 16,
                         Dealer(usable_users(store, 16)).order)
