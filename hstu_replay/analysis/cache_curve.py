"""The token hit ratio of a trace at every KV-cache budget, in one pass (stack distances).

The cache is the server's (`cache_ledger`): whole users, LRU, counted in pages; a request's
users find what they held when it arrives and then hold their new history. Between two visits
of a user its history only grows, and so do the footprints of the users above it in the LRU
order: the held set is always the longest prefix of the recency order that fits the budget.
A returning user therefore hits (all the tokens it held) exactly when the budget covers its own
pages plus the current pages of every distinct user seen since its last visit: its threshold.
One pass computes every threshold with a Fenwick tree over visit positions holding each user's
current pages at its latest visit; the curve is the sorted thresholds with their hit tokens.

Exact for every budget that holds the largest request (`exact_from_tokens`); below that the
server drops a user too large for the whole cache instead of emptying it, which the prefix
rule does not follow, and the curve there is the prefix rule's figure.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS, pages as pages_of


@dataclass(frozen=True, eq=False)
class CacheCurve:
    thresholds: np.ndarray  # pages a budget needs for each hitting access, ascending
    cumulative_hits: np.ndarray  # tokens hit by the accesses up to and including each threshold
    total_tokens: int  # history tokens of every request
    page_tokens: int
    requests: int
    accesses: int
    returning: int  # accesses of users seen before
    exact_from_tokens: int  # budgets from here on are exact
    all_fit_tokens: int  # the smallest budget at which every return hits

    def hit_tokens(self, budget_tokens: int) -> int:
        n = int(np.searchsorted(self.thresholds, budget_tokens // self.page_tokens, side="right"))
        return int(self.cumulative_hits[n - 1]) if n else 0

    def ratio(self, budget_tokens: int) -> float:
        return self.hit_tokens(budget_tokens) / self.total_tokens if self.total_tokens else 0.0

    @property
    def max_ratio(self) -> float:
        return self.ratio(self.all_fit_tokens)

    def points(self) -> list[tuple[int, float]]:
        """(budget tokens, ratio) at each step of the curve, from 0 to where everything fits."""
        steps = np.flatnonzero(np.diff(self.thresholds, append=np.iinfo(np.int64).max)) if len(self.thresholds) else []
        out = [(0, self.ratio(0))]
        out += [(int(self.thresholds[i]) * self.page_tokens, int(self.cumulative_hits[i]) / self.total_tokens)
                for i in steps if self.thresholds[i] > 0]
        return out

    def budget_for(self, ratio: float) -> int | None:
        """The smallest budget (tokens, whole pages) whose ratio reaches `ratio`; None if none does."""
        need = ratio * self.total_tokens
        i = int(np.searchsorted(self.cumulative_hits, need - 1e-9 * max(self.total_tokens, 1), side="left"))
        if ratio <= 0:
            return 0
        if i >= len(self.thresholds):
            return None
        return int(self.thresholds[i]) * self.page_tokens


class _Fenwick:
    def __init__(self, n: int):
        self.n, self.tree = n, array("q", bytes(8 * (n + 1)))  # C integers: 8 bytes a position

    def add(self, i: int, delta: int) -> None:
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum of positions [0, i)."""
        tree, s = self.tree, 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


@dataclass(frozen=True, eq=False)
class Returns:
    """Every access of a user seen before, in send order: the pages a budget needs for it to hit
    (its threshold) and the tokens it then finds; and the largest request, in pages."""

    thresholds: np.ndarray
    hits: np.ndarray
    largest_pages: int


def return_thresholds(keys: np.ndarray, tokens: np.ndarray, bounds: np.ndarray,
                      page_tokens: int = DEFAULT_PAGE_TOKENS) -> Returns:
    """`keys[i]`, `tokens[i]`: the cache key and the tokens it holds after access i, in send order;
    request r is accesses bounds[r]:bounds[r + 1] (distinct keys). A key's tokens never shrink."""
    n = len(keys)
    fen = _Fenwick(n)
    last: dict[int, int] = {}  # key -> position of its latest access
    held: dict[int, int] = {}  # key -> tokens it holds since then
    thresholds, hits = array("q"), array("q")
    tokens = np.asarray(tokens, dtype=np.int64)
    keys_l, tokens_l = array("q", np.asarray(keys, dtype=np.int64).tobytes()), array("q", tokens.tobytes())
    pages_l = array("q", (-(-tokens // page_tokens)).tobytes())  # cache_ledger.pages, for every access
    largest = 0
    for r in range(len(bounds) - 1):
        start, end = int(bounds[r]), int(bounds[r + 1])
        largest = max(largest, sum(pages_l[start:end]))
        before = fen.prefix(start)
        for i in range(start, end):
            j = last.get(keys_l[i])
            if j is not None:  # its pages and those of everyone seen since, as the request arrives
                thresholds.append(before - fen.prefix(j))
                hits.append(held[keys_l[i]])
        for i in range(start, end):
            key = keys_l[i]
            j = last.get(key)
            if j is not None:
                fen.add(j, -pages_of(held[key], page_tokens))
            fen.add(i, pages_l[i])
            last[key], held[key] = i, tokens_l[i]
    return Returns(np.frombuffer(thresholds, dtype=np.int64), np.frombuffer(hits, dtype=np.int64), largest)


def cache_curve(keys: np.ndarray, tokens: np.ndarray, bounds: np.ndarray,
                page_tokens: int = DEFAULT_PAGE_TOKENS) -> CacheCurve:
    """The curve of a trace (see `return_thresholds` for its layout)."""
    returns = return_thresholds(keys, tokens, bounds, page_tokens)
    order = np.argsort(returns.thresholds, kind="stable")
    sorted_thresholds = returns.thresholds[order]
    cumulative = np.cumsum(returns.hits[order])
    return CacheCurve(
        thresholds=sorted_thresholds, cumulative_hits=cumulative,
        total_tokens=int(np.sum(np.asarray(tokens, dtype=np.int64), dtype=np.int64)),
        page_tokens=page_tokens, requests=len(bounds) - 1, accesses=len(keys), returning=len(returns.thresholds),
        exact_from_tokens=returns.largest_pages * page_tokens,
        all_fit_tokens=int(sorted_thresholds[-1]) * page_tokens if len(sorted_thresholds) else 0,
    )
