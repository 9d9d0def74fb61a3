"""The one-pass curve against hand-worked traces, a plain LRU simulator and the target's ledger."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.plan.cache_curve import cache_curve

PAGE = 32


def _lru_hits(requests: list[list[tuple[int, int]]], budget_tokens: int, page: int = PAGE) -> int:
    """Hit tokens of a plain LRU of whole users in pages, simulated request by request."""
    budget = budget_tokens // page
    order: list[int] = []  # least recent first
    held: dict[int, int] = {}
    hits = 0
    for request in requests:
        hits += sum(min(held.get(k, 0), t) for k, t in request)
        for k, t in request:
            if k in held:
                order.remove(k)
            held[k] = t
            order.append(k)
        mine = {k for k, _ in request}
        used = sum(-(-held[k] // page) for k in order)
        for victim in [k for k in order if k not in mine] + [k for k in order if k in mine]:
            if used <= budget:
                break
            used -= -(-held.pop(victim) // page)
            order.remove(victim)
    return hits


def _ledger_hits(requests, budget_tokens: int) -> int:
    ledger = CacheLedger(budget_tokens, PAGE)
    return sum(sum(ledger.serve(r).hits) for r in requests)


def _curve(requests):
    keys = np.array([k for r in requests for k, _ in r])
    tokens = np.array([t for r in requests for _, t in r])
    bounds = np.cumsum([0] + [len(r) for r in requests])
    return cache_curve(keys, tokens, bounds, PAGE)


def test_a_hand_worked_trace():
    # A: 6 tokens (1 page); B: 64 (2 pages); A again with 70 (3 pages); C: 6 (1); B again with 64.
    requests = [[(1, 6)], [(2, 64)], [(1, 70)], [(3, 6)], [(2, 64)]]
    curve = _curve(requests)
    # A's return needs its own page and B's two: 3 pages; B's return needs B 2 + A 3 + C 1 = 6.
    assert curve.thresholds.tolist() == [3, 6]
    assert curve.total_tokens == 210
    assert curve.ratio(95) == 0.0  # 2 pages
    assert curve.ratio(96) == pytest.approx(6 / 210)
    assert curve.ratio(191) == pytest.approx(6 / 210)
    assert curve.ratio(192) == pytest.approx(70 / 210)
    assert curve.all_fit_tokens == 192 and curve.exact_from_tokens == 96
    assert curve.points() == [(0, 0.0), (96, pytest.approx(6 / 210)), (192, pytest.approx(70 / 210))]
    assert curve.budget_for(0.3) == 192 and curve.budget_for(0.02) == 96 and curve.budget_for(0.5) is None
    for budget in (96, 150, 160, 191, 192, 500):
        assert curve.hit_tokens(budget) == _lru_hits(requests, budget) == _ledger_hits(requests, budget)


def test_users_of_one_request_find_what_they_held_when_it_arrived():
    # B and A return together: A is older, so in a one-at-a-time replay B's insertion could evict
    # A first; the server computes hits as the request arrives, and so does the curve.
    requests = [[(1, 32)], [(2, 32)], [(2, 64), (1, 64)]]
    curve = _curve(requests)
    assert sorted(curve.thresholds.tolist()) == [1, 2]  # B needs its page; A its own and B's
    assert curve.hit_tokens(64) == 64 == _lru_hits(requests, 64) == _ledger_hits(requests, 64)
    assert curve.hit_tokens(32) == 32 == _lru_hits(requests, 32)


def _random_trace(rng: random.Random, users: int, requests: int, batch: int, step: int):
    held = {u: 0 for u in range(users)}
    out = []
    for _ in range(requests):
        who = rng.sample(range(users), rng.randint(1, batch))
        request = []
        for u in who:
            if rng.random() < 0.8:  # most returns grow the history, some resend it
                held[u] = min(held[u] + rng.randint(1, step), 600) if held[u] else 6 + 2 * rng.randint(0, step)
            request.append((u, max(held[u], 6)))
            held[u] = max(held[u], 6)
        out.append(request)
    return out


@pytest.mark.parametrize("seed,batch", [(1, 1), (2, 1), (3, 4), (4, 8)])
def test_random_traces_match_both_simulators_at_every_exact_budget(seed, batch):
    rng = random.Random(seed)
    requests = _random_trace(rng, users=40, requests=600, batch=batch, step=80)
    curve = _curve(requests)
    budgets = sorted({curve.exact_from_tokens, curve.all_fit_tokens, curve.all_fit_tokens - PAGE,
                      *(rng.randint(curve.exact_from_tokens, curve.all_fit_tokens + 200) for _ in range(8)),
                      *(b for b, _ in curve.points()[1:][::max(1, len(curve.points()) // 6)])})
    budgets = [b for b in budgets if b >= curve.exact_from_tokens]
    assert len(budgets) >= 6
    for budget in budgets:
        plain = _lru_hits(requests, budget)
        assert curve.hit_tokens(budget) == plain, budget
        assert _ledger_hits(requests, budget) == plain, budget
    # The curve climbs to every return hitting, not beyond.
    assert curve.hit_tokens(curve.all_fit_tokens) == _lru_hits(requests, 10**9)
    assert curve.hit_tokens(curve.all_fit_tokens - PAGE) < curve.hit_tokens(curve.all_fit_tokens)
    ratios = [r for _, r in curve.points()]
    assert ratios == sorted(ratios) and 0 < ratios[-1] < 1
