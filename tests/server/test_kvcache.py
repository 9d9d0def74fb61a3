import pytest
import torch

from hstu_replay.errors import LimitError
from hstu_replay.server.kvcache import KVCache


def kv(tokens, fill=0.0):
    t = torch.full((2, tokens, 2, 4), fill)
    return t, t.clone()


def serve(cache, *pairs):
    """One request of (key, total tokens): account it, then store full-length entries."""
    plan = cache.begin([k for k, _ in pairs], [t for _, t in pairs])
    for key, tokens in pairs:
        cache.store(key, *kv(tokens))
    return [r.hit for r in plan]


def test_reuse_is_what_the_key_held_and_entries_follow_the_ledger():
    cache = KVCache(None)
    assert serve(cache, (1, 10)) == [0]
    assert serve(cache, (1, 30), (2, 8)) == [10, 0]
    plan = cache.begin([1], [30])
    assert plan[0].hit == 30 and plan[0].entry.tokens == 30 and plan[0].onboarded == 0
    assert cache.stats()["hit_tokens"] == 40 and cache.stats()["computed_tokens"] == 38


def test_lru_eviction_in_pages_drops_the_tensors_too():
    cache = KVCache(4 * 32, page_tokens=32)
    serve(cache, (1, 33))  # 2 pages
    serve(cache, (2, 32))  # 1 page
    serve(cache, (1, 40))  # 1 becomes the most recent
    serve(cache, (3, 40))  # 2 pages: 2 (LRU) goes
    assert cache.keys() == [1, 3] and 2 not in cache and cache.stats()["evicted_users"] == 1
    assert cache.stats()["used_pages"] == 4


def test_store_of_a_history_the_ledger_does_not_hold_is_refused():
    cache = KVCache(64, page_tokens=32)
    cache.begin([1], [100])  # larger than the whole budget: served, not kept
    assert not cache.store(1, *kv(100)) and 1 not in cache and cache.held(1) == 0


def test_unsafe_requests_are_refused_without_touching_anything():
    cache = KVCache(None)
    serve(cache, (7, 20), (8, 10))
    before = (cache.keys(), cache.stats())
    with pytest.raises(LimitError, match="twice"):
        cache.check_request([9, 9], [10, 10])
    with pytest.raises(LimitError, match="shorter than the 20 held"):
        cache.check_request([8, 7], [12, 18])
    cache.check_request([7, 8, 9], [20, 30, 6])
    assert (cache.keys(), cache.stats()) == before


def test_forget_and_clear():
    cache = KVCache(None)
    serve(cache, (1, 10), (2, 10))
    cache.forget(1)
    assert cache.held(1) == 0 and 1 not in cache and 2 in cache
    cache.clear()
    assert len(cache) == 0 and cache.stats()["requests"] == 0 and cache.held(2) == 0
