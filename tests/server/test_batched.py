"""The batched engine (every user of a request in one pass over the page pool) against the per-user engine."""

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hstu_replay.server.batched_step as batched_step
from hstu_replay.errors import LimitError
from hstu_replay.interface import history_tokens
from hstu_replay.request import build_request
from hstu_replay.server.batched import BatchedEngine, build_batched_engine
from hstu_replay.server.build import ENGINE_KINDS
from hstu_replay.server.engine import RankingEngine
from hstu_replay.server.kvcache import KVCache
from hstu_replay.server.model import EagerCompute, build_model
from tests.server.test_engine import SMALL, make_user, prefix, serve

ATOL = 1e-4


@lru_cache(maxsize=1)
def model():
    return build_model(SMALL, seed=0)


@lru_cache(maxsize=1)
def compute():
    return EagerCompute(model())


def per_user(budget=1 << 13, page_tokens=32):
    return RankingEngine(SMALL, compute(), KVCache(budget, page_tokens))


def batched_engine(budget=1 << 13, page_tokens=32):
    return build_batched_engine(model(), budget, page_tokens)


@lru_cache(maxsize=1)
def cold():
    return RankingEngine(SMALL, compute(), None)


def tiers(stats):
    """A cache's figures without its memory ones (a page pool and per-user tensors take memory differently)."""
    return {k: v for k, v in stats.items() if k not in ("resident_bytes", "budget_bytes")}


def both(engines, *users):
    """Serve one request on the per-user and the batched engine; they must agree."""
    ref, new = (serve(e, *users) for e in engines)
    assert new.cached_tokens.tolist() == ref.cached_tokens.tolist()
    assert new.computed_tokens.tolist() == ref.computed_tokens.tolist()
    assert new.host_cached_tokens.tolist() == ref.host_cached_tokens.tolist()
    assert new.cached_tokens.dtype == new.computed_tokens.dtype == np.int64
    assert new.logits.dtype == np.float32 and new.logits.shape == ref.logits.shape
    np.testing.assert_allclose(new.logits, ref.logits, atol=ATOL, rtol=0)
    return new


def pool_is_consistent(eng):
    """Every page is free or held by a key the ledger keeps, for exactly its tokens."""
    cache = eng.cache
    assert cache.free_pages + cache.stats()["used_pages"] == cache.num_pages
    assert cache.stats()["used_pages"] <= cache.ledger.budget_pages


@settings(max_examples=12, deadline=None)
@given(users=st.lists(st.tuples(st.integers(0, 60), st.floats(0, 1), st.integers(0, 6), st.sampled_from("cpf")),
                      min_size=1, max_size=5),
       page_tokens=st.sampled_from([1, 8, 32]), seed=st.integers(0, 1 << 16))
def test_cold_partly_and_fully_cached_users_in_one_request(users, page_tokens, seed):
    engines = per_user(page_tokens=page_tokens), batched_engine(page_tokens=page_tokens)
    full = [make_user(100 + i, hist, cand, seed=seed) for i, (hist, _, cand, _) in enumerate(users)]
    primed = [prefix(u, int(cut * u.history_length) if state == "p" else u.history_length, cand_seed=seed)
              for u, (_, cut, _, state) in zip(full, users) if state != "c"]
    if primed:
        both(engines, *primed)
    result = both(engines, *full)
    want_hits = [history_tokens(int(cut * hist)) if state == "p" else history_tokens(hist) if state == "f" else 0
                 for hist, cut, _, state in users]
    assert result.cached_tokens.tolist() == want_hits
    np.testing.assert_allclose(result.logits, serve(cold(), *full).logits, atol=ATOL, rtol=0)
    assert tiers(engines[1].cache.stats()) == tiers(engines[0].cache.stats())
    pool_is_consistent(engines[1])


def test_a_full_request_of_the_longest_histories_has_pages_to_compute_in():
    # 8 users of 256 items (518 tokens) half cached; the budget keeps about two of them
    engines = per_user(budget=1024), batched_engine(budget=1024)
    users = [make_user(200 + i, 256, 4 if i % 2 else 32, seed=i) for i in range(SMALL.max_batch)]
    both(engines, *[prefix(u, 128) for u in users[:4]])
    both(engines, *[prefix(u, 128) for u in users[4:]])
    result = both(engines, *users)
    assert result.cached_tokens.sum() > 0
    assert engines[1].cache.ledger.keys() == engines[0].cache.ledger.keys()
    assert tiers(engines[1].cache.stats()) == tiers(engines[0].cache.stats())
    pool_is_consistent(engines[1])


def test_eviction_under_a_tight_budget_gives_the_per_user_engines_hits():
    engines = per_user(budget=256, page_tokens=32), batched_engine(budget=256, page_tokens=32)  # 8 pages
    rng = np.random.default_rng(7)
    whole = {uid: make_user(uid, 120, 3, seed=uid) for uid in range(1, 7)}
    served = dict.fromkeys(whole, 0)
    hits = 0
    for step in range(14):
        uids = rng.choice(list(whole), size=int(rng.integers(1, 4)), replace=False)
        request = []
        for uid in uids:
            served[uid] = min(120, served[uid] + int(rng.integers(0, 40)))
            request.append(prefix(whole[uid], served[uid], cand_seed=step))
        result = both(engines, *request)
        hits += int(result.cached_tokens.sum() > 0)
        assert engines[1].cache.ledger.keys() == engines[0].cache.ledger.keys()
        assert tiers(engines[1].cache.stats()) == tiers(engines[0].cache.stats())
        pool_is_consistent(engines[1])
    stats = engines[1].cache.stats()
    assert hits > 0 and stats["evicted_users"] > 0  # the sequence does exercise both


class Boom(RuntimeError):
    pass


def test_a_request_failing_in_its_forward_pass_holds_no_pages(monkeypatch):
    eng = batched_engine(budget=4096)
    a, b, c = make_user(1, 40, 2), make_user(2, 20, 2), make_user(3, 30, 2)
    serve(eng, prefix(a, 20), b)
    free_before = eng.cache.free_pages
    calls = []
    real = batched_step.paged_attention

    def fail_in_the_second_layer(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first layer has already written its keys into the pool
            raise Boom("forced")
        return real(*args, **kwargs)

    monkeypatch.setattr(batched_step, "paged_attention", fail_in_the_second_layer)
    with pytest.raises(Boom):
        serve(eng, a, c)
    monkeypatch.setattr(batched_step, "paged_attention", real)
    assert eng.cache.ledger.keys() == [2] and eng.cache.held(1) == eng.cache.held(3) == 0
    assert eng.cache.free_pages == free_before + 2  # a's old pages (46 tokens) are back; nothing new kept
    pool_is_consistent(eng)
    after = serve(eng, a, c, b)  # cold again for the failed users, and right
    assert after.cached_tokens.tolist() == [0, 0, history_tokens(20)]
    np.testing.assert_allclose(after.logits, serve(cold(), a, c, b).logits, atol=ATOL, rtol=0)


def test_refused_requests_touch_nothing():
    eng = batched_engine(budget=4096)
    serve(eng, make_user(1, 20, 2))
    before = (eng.cache.ledger.keys(), eng.cache.stats(), eng.cache.free_pages)
    with pytest.raises(LimitError, match="exceeds 256"):
        serve(eng, make_user(2, 257, 1))
    with pytest.raises(LimitError, match="appears twice"):
        serve(eng, make_user(3, 20, 2, key=9), make_user(4, 5, 2, key=9))
    with pytest.raises(LimitError, match="shorter than the 46 held"):
        serve(eng, make_user(5, 3, 1), prefix(make_user(1, 20, 2), 10))
    with pytest.raises(LimitError, match="batch of 9"):
        serve(eng, *[make_user(10 + i, 1, 1) for i in range(9)])
    assert (eng.cache.ledger.keys(), eng.cache.stats(), eng.cache.free_pages) == before
    assert serve(eng, make_user(1, 20, 2)).cached_tokens.tolist() == [46]


def test_the_uncached_engine_never_hits():
    eng = batched_engine(budget=0)
    users = [make_user(1, 30, 3), make_user(2, 0, 1), make_user(3, 256, 2)]
    for _ in range(2):
        result = serve(eng, *users)
        assert result.cached_tokens.tolist() == [0, 0, 0]
        assert result.computed_tokens.tolist() == [history_tokens(u.history_length) for u in users]
        np.testing.assert_allclose(result.logits, serve(cold(), *users).logits, atol=ATOL, rtol=0)
        assert eng.cache.free_pages == eng.cache.num_pages and len(eng.cache.ledger) == 0


def test_clear_cache_and_a_request_with_no_candidates():
    eng = batched_engine()
    serve(eng, make_user(1, 10, 0))
    nothing = serve(eng, make_user(1, 10, 0))
    assert nothing.logits.shape == (0, 8) and nothing.cached_tokens.tolist() == [26]
    eng.clear_cache()
    assert eng.cache.free_pages == eng.cache.num_pages and eng.cache.stats()["requests"] == 0
    assert serve(eng, make_user(1, 10, 1)).cached_tokens.tolist() == [0]


def test_the_engine_kinds_registry(tmp_path):
    assert set(ENGINE_KINDS) == {"aoti", "batched", "batched-aoti"}
    engines = ENGINE_KINDS["batched"](tmp_path / "unused", SMALL, 0, 512, 32, "cpu")
    assert isinstance(engines.cached, BatchedEngine) and isinstance(engines.uncached, BatchedEngine)
    assert engines.cached.cache.ledger.budget_pages == 16 and engines.uncached.cache.ledger.budget_pages == 0
    assert engines.cached.model is engines.uncached.model
    user = make_user(1, 12, 3)
    for eng in (engines.cached, engines.uncached):
        np.testing.assert_allclose(serve(eng, user).logits, serve(cold(), user).logits, atol=ATOL, rtol=0)
    assert not list(tmp_path.iterdir())  # nothing compiled, nothing written


def test_bfloat16_weights_and_pool():
    config = replace(SMALL, dtype="bfloat16")
    eng = build_batched_engine(build_model(config, seed=0), 1 << 13, 32)
    assert eng.cache.pool_k.dtype.is_floating_point and str(eng.cache.pool_k.dtype) == "torch.bfloat16"
    users = [make_user(1, 200, 16), make_user(2, 50, 4)]
    serve(eng, prefix(users[0], 100))
    result = serve(eng, *users)
    assert result.cached_tokens.tolist() == [history_tokens(100), 0] and result.logits.dtype == np.float32
    want = serve(cold(), *users).logits  # float32 weights: bf16 answers stay within the dumps' tolerance
    assert np.abs(result.logits - want).max() <= 0.0625, np.abs(result.logits - want).max()
    assert build_request(users).num_logits == len(result.logits)
