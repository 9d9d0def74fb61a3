from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hstu_replay.errors import InputError, LimitError
from hstu_replay.interface import history_tokens
from hstu_replay.request import UserRequest, build_request
from hstu_replay.server.model_config import get_config
from hstu_replay.server.engine import RankingEngine
from hstu_replay.server.kvcache import KVCache
from hstu_replay.server.model import EagerCompute, build_model

SMALL = get_config("small")
ATOL = 1e-4


@lru_cache(maxsize=1)
def compute():
    return EagerCompute(build_model(SMALL, seed=0))


def engine(max_tokens=1 << 20, page_tokens=32):
    return RankingEngine(SMALL, compute(), KVCache(max_tokens, page_tokens))


@lru_cache(maxsize=1)
def cold_engine():
    return RankingEngine(SMALL, compute(), None)


def make_user(uid, hist, cand, seed=0, key=None):
    rng = np.random.default_rng([uid, seed])
    items = rng.integers(0, 1 << 40, hist + cand, dtype=np.int64)
    return UserRequest(uid, tuple(int(x) for x in rng.integers(0, 50, 5)), items[:hist],
                       rng.integers(0, 256, hist, dtype=np.int64), items[hist:], key)


def prefix(user, hist, cand_seed=99):
    """The same user with only the first `hist` items, and other candidates."""
    other = make_user(user.user_id, 0, 3, seed=cand_seed).candidates
    return replace(user, history_items=user.history_items[:hist], history_actions=user.history_actions[:hist],
                   candidates=other)


def serve(eng, *users):
    return eng.infer(build_request(list(users)))


@settings(max_examples=20, deadline=None)
@given(hist=st.integers(0, 60), cut=st.floats(0, 1), cand=st.integers(1, 8), seed=st.integers(0, 1 << 16))
def test_cached_results_equal_cold_ones(hist, cut, cand, seed):
    user = make_user(7, hist, cand, seed=seed)
    split = int(cut * hist)
    cold = serve(cold_engine(), user)
    assert cold.cached_tokens.tolist() == [0] and cold.computed_tokens.tolist() == [history_tokens(hist)]
    eng = engine()
    serve(eng, prefix(user, split))  # partial hit next
    partial = serve(eng, user)
    assert partial.cached_tokens.tolist() == [history_tokens(split)]
    assert partial.computed_tokens.tolist() == [2 * (hist - split)]
    np.testing.assert_allclose(partial.logits, cold.logits, atol=ATOL, rtol=0)
    fresh = replace(user, candidates=make_user(8, 0, cand + 1, seed=seed).candidates)
    full = serve(eng, fresh)  # same history, new candidates: all hits
    assert full.cached_tokens.tolist() == [history_tokens(hist)] and full.computed_tokens.tolist() == [0]
    np.testing.assert_allclose(full.logits, serve(cold_engine(), fresh).logits, atol=ATOL, rtol=0)


def test_a_batch_with_different_hit_amounts():
    users = [make_user(uid, hist, cand) for uid, hist, cand in [(1, 40, 3), (2, 25, 1), (3, 10, 5), (4, 0, 2)]]
    eng = engine()
    serve(eng, prefix(users[0], 12), users[1], prefix(users[3], 0))  # user 3 never seen
    result = serve(eng, *users)
    assert result.cached_tokens.tolist() == [history_tokens(12), history_tokens(25), 0, history_tokens(0)]
    assert result.computed_tokens.tolist() == [56, 0, history_tokens(10), 0]
    assert result.logits.shape == (11, 8) and result.logits.dtype == np.float32
    assert result.cached_tokens.dtype == result.computed_tokens.dtype == np.int64
    np.testing.assert_allclose(result.logits, serve(cold_engine(), *users).logits, atol=ATOL, rtol=0)
    stats = eng.cache.stats()
    assert stats["requests"] == 2 and stats["hit_tokens"] == int(result.cached_tokens.sum()) + 0
    assert stats["computed_tokens"] == history_tokens(12) + history_tokens(25) + 6 + int(result.computed_tokens.sum())


def test_the_cache_key_is_input_3_not_the_user_id():
    eng = engine()
    serve(eng, make_user(1, 10, 2))
    assert serve(eng, make_user(1, 10, 2, key=555)).cached_tokens.tolist() == [0]
    assert serve(eng, make_user(1, 10, 2, key=555)).cached_tokens.tolist() == [history_tokens(10)]


def test_unsafe_requests_are_refused_before_the_cache_is_touched():
    eng = engine()
    serve(eng, make_user(1, 20, 2))
    before = (eng.cache.keys(), eng.cache.stats())
    with pytest.raises(LimitError, match="appears twice"):
        serve(eng, make_user(1, 20, 2, key=9), make_user(2, 5, 2, key=9))
    with pytest.raises(LimitError, match="shorter than the 46 held"):
        serve(eng, make_user(2, 3, 1), prefix(make_user(1, 20, 2), 10))
    assert (eng.cache.keys(), eng.cache.stats()) == before
    assert serve(eng, make_user(1, 20, 2)).cached_tokens.tolist() == [46]


def test_limits_and_layout_are_checked():
    eng = engine()
    with pytest.raises(LimitError, match="exceeds 256"):
        serve(eng, make_user(1, 257, 1))
    with pytest.raises(LimitError, match="candidates exceed 32"):
        serve(eng, make_user(1, 2, 33))
    request = build_request([make_user(1, 4, 1)])
    with pytest.raises(InputError, match="total_history_length 99"):
        eng.infer(replace(request, total_history_lengths=np.array([99])))
    assert eng.cache.stats()["requests"] == 0


def test_eviction_under_a_small_budget():
    eng = engine(max_tokens=128, page_tokens=32)  # 4 pages
    a, b, c = make_user(1, 20, 1), make_user(2, 13, 1), make_user(3, 5, 1)  # 46, 32, 16 tokens: 2, 1, 1 pages
    serve(eng, a)
    serve(eng, b)
    serve(eng, c)
    assert eng.cache.keys() == [1, 2, 3] and eng.cache.stats()["used_pages"] == 4
    serve(eng, a)  # a hit; 1 is now the most recent
    d = make_user(4, 5, 1)
    serve(eng, d)  # needs a page: LRU is 2
    assert eng.cache.keys() == [3, 1, 4] and eng.cache.stats()["evicted_users"] == 1
    assert serve(eng, b).cached_tokens.tolist() == [0]  # evicted: cold again (and evicts 3)
    assert eng.cache.keys() == [1, 4, 2]


def test_running_users_are_not_evicted_by_each_other():
    eng = engine(max_tokens=96, page_tokens=32)  # 3 pages
    grown_a, grown_b = make_user(1, 30, 1), make_user(2, 30, 1)  # 66 tokens: 3 pages each
    serve(eng, prefix(grown_a, 13), prefix(grown_b, 13))  # 32 tokens: 1 page each
    result = serve(eng, grown_a, grown_b)  # a can't grow while b is protected; b can't either
    assert result.cached_tokens.tolist() == [32, 32]
    assert 2 in eng.cache and 1 not in eng.cache and eng.cache.stats()["evicted_users"] == 0
    np.testing.assert_allclose(result.logits, serve(cold_engine(), grown_a, grown_b).logits, atol=ATOL, rtol=0)


def test_clear_cache_and_no_cache_engine():
    eng = engine()
    serve(eng, make_user(1, 5, 1))
    eng.clear_cache()
    assert len(eng.cache) == 0 and eng.cache.stats()["requests"] == 0
    assert serve(eng, make_user(1, 5, 1)).cached_tokens.tolist() == [0]
    cold = cold_engine()
    twice = [serve(cold, make_user(1, 5, 1)) for _ in range(2)]
    assert [r.cached_tokens.tolist() for r in twice] == [[0], [0]]
    cold.clear_cache()  # no cache: nothing to do
