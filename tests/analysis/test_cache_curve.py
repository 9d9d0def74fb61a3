"""The one-pass curve against hand-worked traces, a plain LRU simulator and the target's ledger."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.analysis.cache_curve import cache_curve

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


# -- histories past the limit: the curve and the counts of each --over-limit policy --------------
#
# One hand-made log, a limit of 4 items (batch 1, 1 candidate), pages of 4 tokens, a rebase keeping
# 2 items. User A's events (seconds): 0 1 | 100 101 | 200 201 | 300 301 | 400; user B: 50 | 150 151 | 250.
# Visits (a gap of 60 s) in time order, with the history before each (tokens = 6 + 2 x items):
#   A@100 2 items, B@150 1, A@200 4, B@250 3, A@300 6 (past the limit), A@400 8 (past the limit).
# skip:   cold A@100 (10 tokens) + B@150 (8); warm A@200 (14) + B@250 (12); A@300, A@400 skipped
#         (2 x 14, what they would send at the limit). Hits with room for all: A@200 finds 10, B@250 8:
#         18 of the 44 sent. Thresholds: A@200 needs A's 3 pages + B's 2 = 5 pages; B@250 B's 2 + A's 4 = 6.
# oldest: the same, then A@300 and A@400 frozen: A's first 4 items again (14 tokens each), full hits:
#         46 of 72. A@300 needs A's 4 pages + B's 3 = 7 pages; A@400 its own 4 pages.
# rebase: A@300 rebased: items 4..5 (10 tokens) on a fresh key, no hit; A@400 extends it to items 4..7
#         (14 tokens, warm) and finds the 10: hits 28 of 68. A@400 needs the new key's 3 pages only.
LIMIT, KEEP, SMALL_PAGE = 4, 0.5, 4
LOG = {0: [0, 1, 100, 101, 200, 201, 300, 301, 400], 1: [50, 150, 151, 250]}  # seconds
EXPECTED = {  # visits and tokens of (warm, cold, rebased, frozen, skipped); hits at budgets (tokens)
    "skip": ((2, 2, 0, 0, 2), (26, 18, 0, 0, 28), {16: 0, 20: 10, 24: 18, 1000: 18}),
    "oldest": ((2, 2, 0, 2, 0), (26, 18, 0, 28, 0), {16: 14, 20: 24, 24: 32, 28: 46, 1000: 46}),
    "rebase": ((3, 2, 1, 0, 0), (40, 18, 10, 0, 0), {16: 10, 20: 20, 24: 28, 1000: 28}),
}


def _plain_visits(log: dict[int, list[int]], policy: str) -> list[tuple[int, int, tuple, int, str, int]]:
    """(time, user, cache key, history items, kind, first history item) of every visit, one a
    request, by the policy's own words: past the limit, skip sends nothing, oldest the first LIMIT
    items, rebase the latest KEEP x LIMIT on a new key and appends to them until the limit comes again."""
    out = []
    for user, seconds in log.items():
        starts = [i for i in range(1, len(seconds)) if seconds[i] - seconds[i - 1] >= 60]
        base, epoch = 0, 0
        for n, s in enumerate(starts):
            if s - base <= LIMIT:
                kind, items = ("cold" if n == 0 else "warm"), s - base
            elif policy == "skip":
                kind, items = "skipped", LIMIT
            elif policy == "oldest":
                kind, items = "frozen", LIMIT
            else:
                base, epoch = s - int(KEEP * LIMIT), epoch + 1
                kind, items = "rebased", s - base
            out.append((seconds[s], user, (user, epoch), items, kind, 0 if kind == "frozen" else s - items))
    return sorted(out)


class _Store:
    """The hand-made log as the store columns a replay reads."""

    def __init__(self, log: dict[int, list[int]]):
        self.offsets = np.cumsum([0] + [len(t) for t in log.values()])
        self.times_ms = np.concatenate([np.asarray(t, dtype=np.int64) * 1000 for t in log.values()])

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def user(self, u: int):
        from hstu_replay.data.store import UserHistory

        n = int(self.offsets[u + 1] - self.offsets[u])
        ids = np.arange(100 * u, 100 * u + n, dtype=np.int64)  # item i of user u: 100 u + i
        return UserHistory(u, (0, 0, 0, 0, 0), ids, np.ones(n, dtype=np.int64), self.times_ms[self.offsets[u]:][:n])


@pytest.mark.parametrize("policy", ["skip", "oldest", "rebase"])
def test_each_over_limit_policy_against_a_plain_replay(policy):
    from hstu_replay.interface import Limits
    from hstu_replay.plan.over_limit import KINDS, HistoryPolicy
    from hstu_replay.plan.timeline import build_trace, group_requests

    visits, tokens_of_kind, hits_at = EXPECTED[policy]
    plain = _plain_visits(LOG, policy)
    counts = [sum(v[4] == k for v in plain) for k in KINDS]
    sums = [sum(6 + 2 * v[3] for v in plain if v[4] == k) for k in KINDS]
    assert (tuple(counts), tuple(sums)) == (visits, tokens_of_kind)  # the plain replay agrees with the hand
    sent = [[(v[2], 6 + 2 * v[3])] for v in plain if v[4] != "skipped"]
    for budget, hits in hits_at.items():
        assert _lru_hits(sent, budget, SMALL_PAGE) == hits, budget

    trace = build_trace(_Store(LOG), candidates=1, limits=Limits(max_history=LIMIT), batch_size=1,
                        policy=HistoryPolicy.of(policy, KEEP))
    accounts = trace.accounts()
    assert (accounts.visits, accounts.tokens) == (visits, tokens_of_kind)
    assert [KINDS[k] for k in trace.kind] == [v[4] for v in plain if v[4] != "skipped"]
    curve = cache_curve(trace.cache_keys, trace.tokens, group_requests(trace, 0, 1), SMALL_PAGE)
    assert curve.exact_from_tokens == 16 and curve.total_tokens == sum(t for (_, t), in sent)
    for budget in range(curve.exact_from_tokens, 64, SMALL_PAGE):
        assert curve.hit_tokens(budget) == _lru_hits(sent, budget, SMALL_PAGE), budget
    for budget, hits in hits_at.items():
        assert curve.hit_tokens(budget) == hits, budget
    shares = accounts.to_dict(HistoryPolicy.of(policy, KEEP))
    assert shares["over_limit"] == policy and shares["visits"] == 6 and shares["tokens"] == sum(tokens_of_kind)
    assert sum(k["token_share"] for k in shares["kinds"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("policy", ["skip", "oldest", "rebase"])
def test_the_replay_sends_what_the_policy_says_on_the_right_keys(policy):
    """The requests a natural replay sends: their histories, keys, expected hits and labels."""
    from hstu_replay.interface import Limits
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.over_limit import HistoryPolicy
    from hstu_replay.plan.timeline import Timeline, TimelineSource, build_trace, group_requests, label_accounts

    store, limits = _Store(LOG), Limits(max_history=LIMIT)
    trace = build_trace(store, 1, limits, 1, HistoryPolicy.of(policy, KEEP))
    source = TimelineSource(Timeline(store, trace, group_requests(trace, 0, 1), 1, limits), KeyAllocator(0, 0, 1))
    sent, total = [], None
    while not source.exhausted:
        step = source.next_step(float("nan"), 1)
        retired = source.settle(step, True)
        history = step.request.value_parts[1].tolist()  # after the user id and context: the history items
        sent.append((int(step.request.user_ids[0]), step.expected_hits[0], retired, step.label, history))
        label = label_accounts(step.label)
        total = label if total is None else total + label
    plain = [v for v in _plain_visits(LOG, policy) if v[4] != "skipped"]
    assert len(sent) == len(plain)
    assert (total.visits, total.tokens) == EXPECTED[policy][:2]  # the labels account for every visit
    keys = {}
    for (key, _, _, label, history), (_, user, plain_key, items, kind, first) in zip(sent, plain):
        assert keys.setdefault(plain_key, key) == key  # one key per user and epoch ...
        assert label.split("; ")[0].endswith(f"items {items} {kind}")
        assert history == list(range(100 * user + first, 100 * user + first + items))  # item i of u: 100 u + i
    assert len(set(keys.values())) == len(keys)  # ... and a new one at a rebase
    if policy == "rebase":
        assert sent[4][2] == [keys[(0, 0)]]  # the rebase retires A's old key
        assert sent[4][1] == 0 and sent[5][1] == 10  # a fresh key holds nothing; then the rebased 10 tokens
    if policy == "skip":  # the two skipped visits are named by the last request sent, after them in time
        assert sent[-1][3].endswith("skipped 2 visits 28 tokens")
