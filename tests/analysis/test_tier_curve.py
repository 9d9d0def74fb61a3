"""The two-tier curve against a hand-worked trace and, at every grid point, a plain two-tier
simulator (the oracle server's `TwoTierCache`, written apart from the tool) replayed request by request."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hstu_replay.analysis.tier_curve import tier_curve
from tests.oracle.server import OracleCache, TwoTierCache
PAGE = 32


def _random_trace(rng: random.Random, users: int, requests: int, batch: int, step: int, cap: int):
    """Requests of up to `batch` distinct users whose histories grow by up to `step` tokens (some resend)."""
    held = dict.fromkeys(range(users), 0)
    out = []
    for _ in range(requests):
        request = []
        for u in rng.sample(range(users), rng.randint(1, batch)):
            if rng.random() < 0.8:
                held[u] = min(max(held[u], 6) + rng.randint(1, step), cap)
            held[u] = max(held[u], 6)
            request.append((u, held[u]))
        out.append(request)
    return out


def _curve(requests, mode="flexkv", *chunk):
    keys = np.array([k for r in requests for k, _ in r])
    tokens = np.array([t for r in requests for _, t in r])
    bounds = np.cumsum([0] + [len(r) for r in requests])
    return tier_curve(keys, tokens, bounds, PAGE, mode, *chunk)


def _simulated(requests, gpu: int, host: int, mode: str, *chunk) -> tuple[int, int]:
    if not host:  # the oracle reads a budget of 0 as unbounded: one tier
        cache = OracleCache(gpu, PAGE)
        return sum(sum(cache.apply([k for k, _ in r], [t for _, t in r])) for r in requests), 0
    cache = TwoTierCache(gpu, host, PAGE, mode, *chunk)
    gpu_hits = host_hits = 0
    for request in requests:
        hits = cache.apply([k for k, _ in request], [t for _, t in request])
        host_hits += sum(cache.last_host_hits)
        gpu_hits += sum(hits) - sum(cache.last_host_hits)
    return gpu_hits, host_hits


def test_a_hand_worked_trace():
    # A 64 tokens (2 pages), B 64, C 64, then A again with 96: A needs its 2 pages + B's 2 + C's 2 = 6 pages.
    requests = [[(1, 64)], [(2, 64)], [(3, 64)], [(1, 96)]]
    curve = _curve(requests)
    assert curve.gpu.thresholds.tolist() == [6] and curve.total_tokens == 288
    assert curve.hit_tokens(6 * PAGE, 0) == (64, 0)  # the GPU holds all three
    assert curve.hit_tokens(4 * PAGE, 6 * PAGE) == (0, 64)  # pushed out of the GPU, found on the host
    assert curve.hit_tokens(4 * PAGE, 4 * PAGE) == (0, 0)  # no larger than the GPU: adds nothing
    assert curve.point(4 * PAGE, 6 * PAGE)["host_ratio"] == pytest.approx(64 / 288)
    native = _curve([[(1, 1100)], [(2, 1100)], [(1, 1200)]], "native")
    # native: the host holds A's first chunk (1,024 tokens, 32 pages); the GPU needs 35 + 35 pages
    assert native.hit_tokens(35 * PAGE, 70 * PAGE) == (0, 1024)
    assert native.hit_tokens(70 * PAGE, 0) == (1100, 0)


@pytest.mark.parametrize("mode", ["flexkv", "native"])
@pytest.mark.parametrize("seed,batch", [(1, 1), (3, 4), (4, 8)])
def test_every_grid_point_matches_a_plain_two_tier_simulator(seed, batch, mode):
    rng = random.Random(seed)
    step, cap = (80, 600) if mode == "flexkv" else (700, 6000)  # native offloads whole chunks of 1,024 tokens
    requests = _random_trace(rng, users=40, requests=500, batch=batch, step=step, cap=cap)
    curve = _curve(requests, mode)
    largest = curve.exact_from_tokens
    gpus = sorted({largest, largest + 7 * PAGE, 2 * largest + 3, 4 * largest, 10**9})
    hosts = [0, largest, 2 * largest + 5, 3 * largest, 8 * largest]
    seen_host = 0
    for gpu in gpus:
        for host in hosts:
            want = _simulated(requests, gpu, host, mode)
            assert curve.hit_tokens(gpu, host) == want, (gpu, host)
            seen_host += want[1] > 0
    assert seen_host >= 3  # the grid reaches where the host tier matters


@pytest.mark.parametrize("chunk", [64, 300])
def test_a_native_chunk_other_than_the_default_matches_the_simulator_at_that_chunk(chunk):
    rng = random.Random(chunk)
    requests = _random_trace(rng, users=40, requests=500, batch=4, step=120, cap=900)  # below 1,024 tokens
    curve = _curve(requests, "native", chunk)
    largest = curve.exact_from_tokens
    seen_host = 0
    for gpu in (largest, 2 * largest + 3, 4 * largest):
        for host in (largest, 3 * largest, 8 * largest):
            want = _simulated(requests, gpu, host, "native", chunk)
            assert curve.hit_tokens(gpu, host) == want, (gpu, host)
            seen_host += want[1] > 0
    assert seen_host >= 3  # with the default chunk no history here reaches the host at all
    assert _curve(requests, "native").hit_tokens(largest, 8 * largest)[1] == 0
