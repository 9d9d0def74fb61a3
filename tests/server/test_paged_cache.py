"""The batched engine's page pool: pages follow the ledger, and every page is either owned or free."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hstu_replay.cache_ledger import pages
from hstu_replay.errors import LimitError
from hstu_replay.server.model_config import get_config
from hstu_replay.server.paged_cache import PagedKVCache

# 2 users of at most 46 tokens a request: 2 pages of 32 each, so a request needs at most 4 pages
TINY = replace(get_config("small"), max_batch=2, max_history=20)
PAGE = 32


def cache(budget_tokens=128, page_tokens=PAGE, config=TINY):
    return PagedKVCache(config, budget_tokens, page_tokens, "cpu", torch.float32)


def request(c, *pairs):
    """begin + finish of one request of (key, total) pairs; the users' pages as begin gave them."""
    placed = c.begin([k for k, _ in pairs], [t for _, t in pairs])
    c.finish([k for k, _ in pairs])
    return {p.key: p for p in placed}


def test_the_pool_has_room_for_the_budget_plus_one_full_request_and_starts_at_one_request():
    c = cache(budget_tokens=130)  # 4 whole pages
    assert c.num_pages == 4 + 2 * pages(TINY.max_history_tokens, PAGE) == 8
    assert c.free_pages == c.num_pages
    # memory for one full request (2 users of 2 pages) only, until more is used
    assert c.allocated_pages == 4
    assert c.pool_k.shape == c.pool_v.shape == (TINY.num_layers, 4 * PAGE, TINY.num_heads, TINY.head_dim)
    assert c.pool_k.dtype == torch.float32
    page_bytes = PAGE * 2 * TINY.num_layers * TINY.num_heads * TINY.head_dim * 4  # K and V, fp32
    assert (c.stats()["resident_bytes"], c.stats()["budget_bytes"]) == (4 * page_bytes, 8 * page_bytes)
    with pytest.raises(LimitError):
        cache(budget_tokens=-1)


def test_a_reserved_pool_takes_its_whole_budget_at_start_and_places_pages_as_a_growing_one():
    page_bytes = PAGE * 2 * TINY.num_layers * TINY.num_heads * TINY.head_dim * 4
    reserved = PagedKVCache(TINY, 256, PAGE, "cpu", torch.float32, reserve=True)  # 8 pages + a request's 4
    assert (reserved.allocated_pages, reserved.num_pages, reserved.generation) == (12, 12, 1)
    assert reserved.stats()["resident_bytes"] == reserved.stats()["budget_bytes"] == 12 * page_bytes
    growing = cache(budget_tokens=256)
    # past the first request's 4 pages (the growing pool grows), then evictions free pages for reuse
    for pairs in [((1, 20), (2, 40)), ((3, 46), (4, 46)), ((1, 46), (5, 30)), ((6, 46), (7, 46))]:
        assert request(reserved, *pairs) == request(growing, *pairs), pairs
    assert growing.generation > 1 and growing.stats()["resident_bytes"] > 4 * page_bytes
    assert reserved.generation == 1 and reserved.stats()["resident_bytes"] == 12 * page_bytes


def test_a_hit_reuses_its_pages_and_appends_after_the_held_tokens():
    c = cache(budget_tokens=256)
    first = request(c, (1, 20))[1]
    assert (first.hit, first.total, len(first.pages)) == (0, 20, 1)
    grown = request(c, (1, 40))[1]  # 20 held: the page is reused, a second one appended
    assert (grown.hit, grown.total) == (20, 40)
    assert grown.pages[:1] == first.pages and len(grown.pages) == 2
    again = request(c, (1, 40))[1]  # fully cached: the same pages, nothing new
    assert (again.hit, again.pages) == (40, grown.pages)
    more = request(c, (1, 46))[1]  # still fits in the second page
    assert (more.hit, more.pages) == (40, grown.pages)
    assert c.free_pages == c.num_pages - 2
    page_bytes = PAGE * 2 * TINY.num_layers * TINY.num_heads * TINY.head_dim * 4
    stats = c.stats()
    assert {k: stats[k] for k in ("hit_tokens", "computed_tokens", "evicted_users", "requests", "resident_users",
                                  "resident_tokens", "used_pages", "budget_pages", "page_tokens",
                                  "gpu_budget_tokens", "host_budget_tokens", "host_hit_tokens", "resident_bytes",
                                  "budget_bytes")} == {
        "hit_tokens": 100, "computed_tokens": 46, "evicted_users": 0, "requests": 4, "resident_users": 1,
        "resident_tokens": 46, "used_pages": 2, "budget_pages": 8, "page_tokens": PAGE, "gpu_budget_tokens": 256,
        "host_budget_tokens": 0, "host_hit_tokens": 0, "resident_bytes": 4 * page_bytes,
        "budget_bytes": 12 * page_bytes}  # 4 pages taken of 8 + 4 (one request)


def test_users_of_one_request_get_disjoint_pages():
    c = cache(budget_tokens=256)
    request(c, (1, 33))
    placed = c.begin([2, 1], [46, 46])
    assert [p.key for p in placed] == [2, 1] and [p.hit for p in placed] == [0, 33]
    assert not set(placed[0].pages) & set(placed[1].pages)
    assert c.free_pages == c.num_pages - 4
    c.finish([2, 1])
    assert c.free_pages == c.num_pages - 4  # both kept


def test_eviction_returns_pages_to_the_free_list():
    c = cache(budget_tokens=128)  # 4 pages
    request(c, (1, 46))  # 2 pages
    request(c, (2, 40))  # 2 pages
    request(c, (3, 10))  # 1 page: over the budget
    assert c.ledger.keys() == [2, 3] and c.free_pages == c.num_pages - 3  # 1 was evicted by 3
    assert c.stats()["evicted_users"] == 1
    assert request(c, (1, 46))[1].hit == 0  # cold again; it evicts 2 (least recent), 3 stays
    assert c.ledger.keys() == [3, 1] and c.stats()["evicted_users"] == 2
    assert c.free_pages == c.num_pages - 3
    # everything handed out is still disjoint from the survivors' pages
    now = request(c, (4, 20), (5, 20))
    assert c.ledger.keys() == [1, 4, 5] and c.free_pages == c.num_pages - 4
    owned = [request(c, (k, c.held(k)))[k].pages for k in (1, 4, 5)]
    assert sorted(p for ps in owned for p in ps) == sorted(set(p for ps in owned for p in ps))
    assert owned[1:] == [now[4].pages, now[5].pages]


def test_a_user_too_large_for_the_budget_is_served_then_released():
    c = cache(budget_tokens=32)  # 1 page
    request(c, (1, 10))
    big = c.begin([2], [46])[0]  # 2 pages: more than the whole budget
    assert (big.hit, len(big.pages)) == (0, 2)
    assert c.free_pages == c.num_pages - 3
    c.finish([2])
    assert c.free_pages == c.num_pages - 1 and c.ledger.keys() == [1]  # 1 was not evicted for it
    grown = c.begin([1], [46])[0]  # a held user outgrowing the budget: hit, then dropped
    assert grown.hit == 10 and len(grown.pages) == 2
    c.finish([1])
    assert c.free_pages == c.num_pages and len(c.ledger) == 0


def test_forget_after_a_failure_frees_pages_and_ledger():
    c = cache(budget_tokens=256)
    request(c, (1, 30), (2, 30))
    c.begin([2, 3], [46, 20])
    for key in (2, 3):  # what the engine does when the forward pass raised
        c.forget(key)
    c.finish([2, 3])
    assert c.ledger.keys() == [1] and c.held(2) == c.held(3) == 0
    assert c.free_pages == c.num_pages - 1 and c.stats()["used_pages"] == 1
    c.forget(99)  # nothing held: nothing to do
    assert c.free_pages == c.num_pages - 1
    assert request(c, (2, 46))[2].hit == 0


def test_clear_frees_everything():
    c = cache(budget_tokens=256)
    request(c, (1, 46), (2, 20))
    c.begin([3], [40])  # even in the middle of a request
    c.clear()
    assert c.free_pages == c.num_pages and len(c.ledger) == 0
    assert c.stats()["requests"] == c.stats()["hit_tokens"] == c.stats()["used_pages"] == 0
    assert request(c, (1, 46))[1].hit == 0


@settings(max_examples=40, deadline=None)
@given(budget=st.integers(0, 200), page_tokens=st.sampled_from([1, 7, 16, 32]),
       steps=st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1)), min_size=1, max_size=2),
                                st.integers(0, 9)), min_size=1, max_size=30))
def test_the_pool_never_runs_out_and_every_page_is_owned_or_free(budget, page_tokens, steps):
    c = cache(budget, page_tokens)
    max_tokens = TINY.max_history_tokens
    owned: dict[int, tuple[int, ...]] = {}  # the test's own model: key -> its pages
    for users, event in steps:
        keys, totals = [], []
        for key, grow in users:
            if key in keys:
                continue
            held = c.held(key)
            keys.append(key)
            totals.append(held + int(grow * (max_tokens - held)))
        before = dict(owned)
        held_before = [c.held(k) for k in keys]
        placed = c.begin(keys, totals)
        assert [p.key for p in placed] == keys and [p.total for p in placed] == totals
        for p, held in zip(placed, held_before):
            assert p.hit == held
            assert len(p.pages) == pages(p.total, page_tokens)
            if p.hit:  # held tokens stay where they were; new ones go after them
                assert p.pages[:pages(p.hit, page_tokens)] == before[p.key][:pages(p.hit, page_tokens)]
            owned[p.key] = p.pages
        for key in list(owned):  # evicted by this request
            if key not in keys and c.held(key) == 0:
                del owned[key]
        every = [page for ps in owned.values() for page in ps]
        assert len(every) == len(set(every)) and all(0 <= page < c.allocated_pages <= c.num_pages for page in every)
        assert c.free_pages + len(every) == c.num_pages
        if event == 0:  # the forward pass failed
            for key in keys:
                c.forget(key)
        c.finish(keys)
        for key in list(owned):
            if c.held(key) == 0:
                del owned[key]
            else:
                assert len(owned[key]) == pages(c.held(key), page_tokens)
        every = [page for ps in owned.values() for page in ps]
        assert len(every) == len(set(every))
        assert c.free_pages + len(every) == c.num_pages
        assert c.free_pages + c.stats()["used_pages"] == c.num_pages
        assert c.stats()["used_pages"] <= c.ledger.budget_pages
        if event == 1:
            c.clear()
            owned.clear()
            assert c.free_pages == c.num_pages


def test_a_pool_that_does_not_fit_is_refused_in_one_line():
    with pytest.raises(LimitError, match=r"does not fit on cpu \(.* GiB\); lower --cache-budget-tokens"):
        PagedKVCache(get_config("small"), 10**15, 32, "cpu", torch.float32)


def test_the_pool_grows_in_doublings_as_pages_are_used_and_keeps_what_it_holds():
    c = cache(budget_tokens=32 * 20)  # 20 pages + 4 for a request: 24 at most; starts at 4
    assert c.allocated_pages == 4
    marks = {}
    for key in range(1, 11):  # 10 users of 2 pages each, one request at a time
        placed = request(c, (key, 46))[key]
        slots = c.slots(placed.pages, 0, 46)
        c.pool_k[:, slots] = float(key)  # what a forward pass would have written
        marks[key] = placed.pages
        # 4 -> 8 -> 16 -> 24 (capped at the whole pool), growing only when a request needs more
        assert c.allocated_pages == {1: 4, 2: 4, 3: 8, 4: 8, 5: 16, 6: 16, 7: 16, 8: 16}.get(key, 24)
    assert c.allocated_pages == c.num_pages == 24 and c.free_pages == 4
    for key, owned in marks.items():  # growth copied every held page
        assert bool((c.pool_k[:, c.slots(owned, 0, 46)] == float(key)).all())
    c.clear()
    assert c.allocated_pages == 24 and c.free_pages == 24  # memory taken stays taken


def test_the_page_table_follows_each_users_pages_through_growth_eviction_and_clear():
    c = cache(budget_tokens=128)

    def table(*pairs):
        placed = c.begin([k for k, _ in pairs], [t for _, t in pairs])
        c.finish([k for k, _ in pairs])
        # the oracle: each user's own pages written out by hand, zero padded
        width = max(len(p.pages) for p in placed)
        expected = [list(p.pages) + [0] * (width - len(p.pages)) for p in placed]
        got = c.page_table(placed)
        assert got.dtype == np.int64 and got.tolist() == expected
        return expected

    assert table((1, 20), (2, 40)) == table((1, 20), (2, 40))  # kept rows, same answer
    table((1, 40), (2, 40))  # user 1 grew a page: its row follows
    table((3, 46), (4, 46))  # evicts 1 and 2: their pages go to 3 and 4
    table((1, 20), (2, 46))  # 1 and 2 again, on other pages than their first rows
    c.clear()
    table((2, 20), (1, 46))
