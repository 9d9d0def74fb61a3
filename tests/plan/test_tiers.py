"""The client's two-tier model: hand-worked lookups, and request by request the same as the oracle
server's separately written two-tier cache (tests/oracle/server.py) over random traffic."""

from __future__ import annotations

import random

import pytest

from hstu_replay.plan.tiers import Tier, TierHits, TierModel, tier_of
from tests.oracle.server import TwoTierCache


def test_a_user_pushed_out_of_the_gpu_hits_on_the_host_and_comes_back_to_the_gpu():
    model = TierModel(64, 256, page_tokens=32)  # GPU: 2 pages; host: 8 pages
    assert model.serve([(1, 40)]) == TierHits((0,), (0,))
    assert model.serve([(2, 40)]) == TierHits((0,), (0,))  # 2 + 2 pages > 2: key 1 leaves the GPU
    assert model.where(1) is Tier.HOST and model.where(2) is Tier.GPU
    assert model.serve([(1, 50)]) == TierHits((40,), (40,))  # onboarded whole; key 2 leaves the GPU
    assert model.serve([(1, 60)]) == TierHits((50,), (0,))  # on the GPU now
    assert model.serve([(2, 46)]) == TierHits((40,), (40,))
    assert TierHits((40, 50, 0), (40, 0, 0)).tiers() == (Tier.HOST, Tier.GPU, Tier.MISS)
    assert TierHits((40, 50, 0), (40, 0, 0)).gpu == (0, 50, 0)


def test_evicted_from_both_is_a_miss():
    model = TierModel(32, 64, page_tokens=32)  # one user on the GPU, two on the host
    for key in (1, 2, 3):
        model.serve([(key, 30)])
    assert [model.where(k) for k in (1, 2, 3)] == [Tier.MISS, Tier.HOST, Tier.GPU]
    assert model.serve([(1, 30)]).tiers() == (Tier.MISS,)


def test_native_offload_keeps_whole_chunks_and_the_longer_gpu_copy_wins():
    model = TierModel(2000, 10_000, page_tokens=32, offload_mode="native")
    model.serve([(1, 1100)])
    assert model.host.held(1) == 1024 and model.serve([(1, 1200)]) == TierHits((1100,), (0,))
    model.serve([(2, 1500)])  # 1,200 + 1,500 tokens > 2,000: key 1 leaves the GPU
    assert model.where(1) is Tier.HOST and model.serve([(1, 1300)]) == TierHits((1024,), (1024,))
    short = TierModel(2000, 10_000, page_tokens=32, offload_mode="native")
    short.serve([(1, 500)])
    short.serve([(2, 1900)])
    assert short.serve([(1, 600)]).tiers() == (Tier.MISS,)  # nothing was offloaded: below one chunk


def test_without_a_host_budget_it_is_the_one_tier_ledger():
    model = TierModel(64, 0)
    model.serve([(1, 40)])
    model.serve([(2, 40)])
    assert model.host is None and model.serve([(1, 41)]).tiers() == (Tier.MISS,)
    assert tier_of(0, 0) is Tier.MISS and tier_of(5, 0) is Tier.GPU and tier_of(5, 5) is Tier.HOST


@pytest.mark.parametrize("mode, chunk", [("flexkv", 1024), ("native", 1024), ("native", 100)])
@pytest.mark.parametrize("gpu, host", [(600, 2000), (2000, 600), (3000, 9000), (0, 4000)])
def test_request_by_request_the_oracle_two_tier_cache_agrees(mode, chunk, gpu, host):
    rng = random.Random(hash((mode, chunk, gpu, host)) % 1000)
    model = TierModel(gpu or None, host, page_tokens=32, offload_mode=mode, chunk_tokens=chunk)
    oracle = TwoTierCache(gpu, host, page_tokens=32, offload_mode=mode, chunk_tokens=chunk)
    held: dict[int, int] = {}
    names = list(range(40))  # a retired key is replaced by a fresh one: keys never shrink
    tiers_seen = set()
    for _ in range(3000):
        keys = rng.sample(names, rng.randint(1, 4))
        request = []
        for key in keys:
            held[key] = held.get(key, 0) + rng.choice((0, 6, 30, 200, 900))
            request.append((key, max(held[key], 6)))
            held[key] = max(held[key], 6)
        got = model.serve(request)
        want = oracle.apply([k for k, _ in request], [t for _, t in request])
        assert got.hits == tuple(want) and got.host == tuple(oracle.last_host_hits), request
        tiers_seen.update(got.tiers())
        for i, key in enumerate(names):
            if held.get(key, 0) > 3000:
                names[i] = max(names) + 1
    assert Tier.MISS in tiers_seen and Tier.GPU in tiers_seen
    if host > gpu > 0:
        assert Tier.HOST in tiers_seen
