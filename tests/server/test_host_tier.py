"""The host tier behind both engines: per-tier outcomes worked out by hand, logits equal to a cold pass."""

from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hstu_replay.errors import ConfigError, LimitError
from hstu_replay.server.batched import build_batched_engine
from hstu_replay.server.engine import RankingEngine
from hstu_replay.server.host_tier import OFFLOAD_RULES, HostTier, KVLayout, OffloadMode, TierLookup
from hstu_replay.server.serve_config import HostTierOptions
from hstu_replay.server.kvcache import KVCache
from tests.server.test_batched import cold, compute, model
from tests.server.test_engine import SMALL, make_user, prefix, serve

ATOL = 1e-4
PAGE = 32
LAYOUT = KVLayout(SMALL.num_layers, SMALL.num_heads, SMALL.head_dim, torch.float32)
BPT = 2 * 2 * 2 * 32 * 4  # bytes a token: K and V, 2 layers, 2 heads of 32, fp32


def test_bytes_per_token_and_the_two_offload_rules_by_hand():
    assert LAYOUT.bytes_per_token == BPT == 1024
    native, flexkv = OFFLOAD_RULES[OffloadMode.NATIVE], OFFLOAD_RULES[OffloadMode.FLEXKV]
    assert [native(0, t, 1024) for t in (1023, 1024, 2047, 2500)] == [0, 1024, 1024, 2048]
    assert native(1024, 2047, 1024) == 1024 and native(1024, 2048, 1024) == 2048
    assert [flexkv(0, t, 1024) for t in (1, 1023, 2500)] == [1, 1023, 2500]


def test_the_merge_is_the_longer_tier_and_the_host_part_is_its_whole_sequence():
    lookup = TierLookup(gpu=(0, 64, 64, 32, 0), host=(0, 0, 32, 64, 96))
    assert lookup.hits == (0, 64, 64, 64, 96)
    assert lookup.onboarded == (0, 0, 0, 64, 96)  # the host's whole sequence where it is longer


def test_options_are_checked_in_one_line():
    assert HostTierOptions().build(PAGE, LAYOUT, "cpu") is None  # budget 0: no host tier
    with pytest.raises(ConfigError, match="--host-budget-tokens -1"):
        HostTierOptions(-1)
    with pytest.raises(ConfigError, match="--offload-chunk-tokens 0"):
        HostTierOptions(64, chunk_tokens=0)
    with pytest.raises(LimitError, match="host tier of 0 tokens"):
        HostTier(0, PAGE, OffloadMode.FLEXKV, LAYOUT, "cpu")


def per_user(gpu, host, mode, chunk=1024):
    tier = HostTierOptions(host, mode, chunk).build(PAGE, LAYOUT, "cpu")
    return RankingEngine(SMALL, compute(), KVCache(gpu, PAGE, tier, LAYOUT))


def batched(gpu, host, mode, chunk=1024):
    return build_batched_engine(model(), gpu, PAGE, HostTierOptions(host, mode, chunk))


# history_tokens(13) = 32 tokens (1 page), history_tokens(29) = 64 (2 pages)
@lru_cache(maxsize=None)
def person(uid):
    return make_user(uid, 29, 3, seed=uid)


def short(uid):
    return prefix(person(uid), 13, cand_seed=uid)


A, B, C, D = 1, 2, 3, 4
# GPU pool 2 pages, host 3 pages, FlexKV offload (every user after every forward). By hand:
FLEXKV_STEPS = [
    # (user, tokens) -> cached, host part;   GPU after (LRU first) | host after (LRU first)
    ((A, 32), 0, 0),  # A | A
    ((B, 32), 0, 0),  # A B | A B
    ((C, 32), 0, 0),  # B C (A evicted) | A B C
    ((A, 32), 32, 32),  # C A (B evicted): A onboarded from the host | B C A (the lookup touched A)
    ((D, 32), 0, 0),  # A D (C evicted) | C A D (B evicted: 4 pages > 3)
    ((B, 32), 0, 0),  # D B (A evicted) | A D B (C evicted): B is in neither tier: recomputed
    ((A, 64), 32, 32),  # A (D, B evicted: A takes 2 pages) | B A (D evicted): 32 onboarded, 32 computed
    ((A, 64), 64, 0),  # A | B A: a GPU hit (the host holds no more than the GPU)
]


def request_of(uid, tokens):
    return person(uid) if tokens == 64 else short(uid)


@pytest.mark.parametrize("build", [batched, per_user], ids=["batched", "per-user"])
def test_flexkv_tiers_step_by_step_with_logits_equal_to_cold(build):
    eng = build(64, 96, OffloadMode.FLEXKV)
    for (uid, tokens), cached, host in FLEXKV_STEPS:
        user = request_of(uid, tokens)
        result = serve(eng, user)
        assert (result.cached_tokens.tolist(), result.host_cached_tokens.tolist()) == ([cached], [host]), (uid, tokens)
        assert result.computed_tokens.tolist() == [tokens - cached]
        np.testing.assert_allclose(result.logits, serve(cold(), user).logits, atol=ATOL, rtol=0)
    stats = eng.cache.stats()
    assert stats["hit_tokens"] == 32 + 32 + 64 and stats["host_hit_tokens"] == 64
    assert stats["computed_tokens"] == 6 * 32 + 2 * 64 - 128  # history tokens sent, less those reused
    assert stats["evicted_users"] == 6 and stats["host_evicted_users"] == 3
    assert stats["onboarded_bytes"] == 64 * BPT
    assert stats["offloaded_bytes"] == (4 * 32 + 32 + 32) * BPT  # A B C D, B again, A's growth
    assert (stats["host_resident_tokens"], stats["host_resident_users"]) == (32 + 64, 2)
    assert stats["resident_tokens"] == 64 and stats["gpu_budget_tokens"] == 64
    assert stats["host_budget_tokens"] == 96 and stats["host_resident_bytes"] == 96 * BPT
    assert stats["onboard_micros"] > 0 and stats["offload_micros"] > 0
    assert eng.cache.host.ledger.keys() == [B, A]


# GPU pool 2 pages, host 8 pages, native offload in chunks of 64 tokens. By hand:
NATIVE_STEPS = [
    ((A, 32), 0, 0),  # A | -: 32 tokens, less than a chunk: nothing offloaded
    ((B, 64), 0, 0),  # B (A evicted) | B: one whole chunk offloaded
    ((A, 32), 0, 0),  # A (B evicted) | B: A was never offloaded: recomputed (FlexKV would onboard it)
    ((B, 64), 64, 64),  # B (A evicted) | B: onboarded
]


@pytest.mark.parametrize("build", [batched, per_user], ids=["batched", "per-user"])
def test_native_offloads_whole_chunks_only(build):
    eng = build(64, 256, OffloadMode.NATIVE, chunk=64)
    for (uid, tokens), cached, host in NATIVE_STEPS:
        result = serve(eng, request_of(uid, tokens))
        assert (result.cached_tokens.tolist(), result.host_cached_tokens.tolist()) == ([cached], [host]), (uid, tokens)
    stats = eng.cache.stats()
    assert stats["offloaded_bytes"] == 64 * BPT and stats["onboarded_bytes"] == 64 * BPT
    assert stats["host_hit_tokens"] == 64 and stats["hit_tokens"] == 64


def test_a_batch_mixing_gpu_hit_host_hit_and_miss_equals_cold():
    eng = batched(128, 512, OffloadMode.FLEXKV)
    for uid in (A, B, C):
        serve(eng, person(uid))  # 2 pages each: A is evicted when C arrives
    assert eng.cache.ledger.keys() == [B, C] and eng.cache.host.ledger.keys() == [A, B, C]
    eng.cache.ledger.forget(C)  # drop C from the GPU pool alone (its pages are released at the next finish)
    eng.cache.finish([C])
    users = [person(B), person(A), person(D)]  # GPU hit, host hit, miss
    result = serve(eng, *users)
    assert result.cached_tokens.tolist() == [64, 64, 0] and result.host_cached_tokens.tolist() == [0, 64, 0]
    np.testing.assert_allclose(result.logits, serve(cold(), *users).logits, atol=ATOL, rtol=0)


def test_a_history_shorter_than_the_host_copy_is_refused_untouched():
    eng = batched(64, 256, OffloadMode.FLEXKV)
    serve(eng, person(A))
    serve(eng, person(B))  # A leaves the GPU pool; the host keeps its 64 tokens
    before = eng.cache.stats()
    with pytest.raises(LimitError, match="shorter than the 64 held"):
        serve(eng, short(A))
    assert eng.cache.stats() == before


def test_clear_and_a_failed_request_empty_both_tiers():
    eng = batched(64, 256, OffloadMode.FLEXKV)
    serve(eng, person(A))
    eng.cache.forget(A)
    assert eng.cache.held(A) == eng.cache.host.held(A) == 0
    serve(eng, person(B))
    eng.clear_cache()
    stats = eng.cache.stats()
    assert stats["host_resident_tokens"] == stats["offloaded_bytes"] == stats["resident_tokens"] == 0
    assert serve(eng, person(B)).cached_tokens.tolist() == [0]


# -- the client's tier model against the server's own cache ------------------------------------
# The server's per-user cache and host tier (KVCache + HostTier, what the aoti engine serves with),
# driven with K/V of each user's length and no model; the client's TierModel predicts every request's
# hits and host part from its own ledgers. The offload rule is shared (cache_ledger.OFFLOAD_RULES); the
# bookkeeping around it (lookup, onboarding, the eviction of both pools) is written apart on each side.
# The host pool is small enough, in most examples, to evict users of the same request and others.

TINY = KVLayout(1, 1, 1, torch.float32)


def server_cache(gpu, host, page, mode, chunk):
    return KVCache(gpu, page, HostTierOptions(host, mode, chunk).build(page, TINY, "cpu"), TINY)


def server_serves(cache, request):
    """What the engine does with one request: check, begin, then store each user's whole K/V."""
    keys, totals = [k for k, _ in request], [t for _, t in request]
    cache.check_request(keys, totals)
    plan = cache.begin(keys, totals)
    stored = []
    for key, total in request:
        kv = torch.zeros(1, total, 1, 1)
        cache.store(key, kv, kv)
        stored.append((key, kv, kv))
    cache.offload(stored)
    return tuple(r.hit for r in plan), tuple(r.onboarded for r in plan)


REQUESTS = st.lists(st.lists(st.tuples(st.integers(0, 7), st.sampled_from((0, 1, 5, 30, 64, 200, 700))),
                             min_size=1, max_size=4, unique_by=lambda user: user[0]), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(list(OffloadMode)), chunk=st.sampled_from((1, 7, 32, 64, 100, 256, 1024)),
       page=st.sampled_from((1, 8, 32)), gpu=st.integers(0, 3000), host_share=st.floats(0.05, 1.0),
       requests=REQUESTS)
def test_the_client_tier_model_predicts_the_server_cache_at_any_chunk(mode, chunk, page, gpu, host_share, requests):
    from hstu_replay.cache_ledger import pages
    from hstu_replay.plan.tiers import Tier, TierModel

    held: dict[int, int] = {}
    steps = []
    for users in requests:
        request = []
        for key, growth in users:
            held[key] = held.get(key, 1) + growth
            request.append((key, held[key]))
        steps.append(request)
    # a share of the room for every user's longest copy (all of it: the host never evicts)
    host = max(1, int(host_share * page * sum(pages(tokens, page) for tokens in held.values())))
    model = TierModel(gpu or None, host, page, mode.value, chunk)
    cache = server_cache(gpu or None, host, page, mode, chunk)
    seen = set()
    for request in steps:
        predicted = model.serve(request)
        assert (predicted.hits, predicted.host) == server_serves(cache, request), request
        assert {k: model.host.held(k) for k in held} == {k: cache.host.held(k) for k in held}, request
        seen.update(predicted.tiers())
    event(f"tiers seen: {sorted(t.value for t in seen)}")  # --hypothesis-show-statistics
    event(f"host evictions: {'some' if cache.host.counters.host_evicted_users else 'none'}")


def test_a_non_default_chunk_is_predicted_and_the_default_chunk_would_not_be():
    """Native offload in chunks of 64: a user of 100 tokens has 64 on the host. The client told the
    server's chunk predicts the host hit the server gives; the default chunk (1,024) predicts a miss."""
    from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS
    from hstu_replay.plan.tiers import Tier, TierModel

    steps = [[(A, 100)], [(B, 100)], [(A, 110)]]  # GPU pool 4 pages of 32: B pushes A out of it
    cache = server_cache(128, 1024, PAGE, OffloadMode.NATIVE, 64)
    told = TierModel(128, 1024, PAGE, "native", 64)
    default = TierModel(128, 1024, PAGE, "native")
    assert default.chunk_tokens == DEFAULT_OFFLOAD_CHUNK_TOKENS != 64
    for request in steps:
        served = server_serves(cache, request)
        predicted = told.serve(request)
        assert (predicted.hits, predicted.host, told.host.held(A)) == (*served, cache.host.held(A))
        last = default.serve(request)
    assert served == ((64,), (64,)) and last.tiers() == (Tier.MISS,)
