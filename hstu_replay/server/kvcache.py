"""The target's per-user KV cache: tensors kept beside a `CacheLedger` that decides everything.

The ledger (shared with the load generator's capacity model, so both predict the same hits)
owns the semantics: what a request reuses, what each key holds afterwards, which users are
evicted, least recently used first, under a page-rounded budget, with the running request's
users protected. This class only keeps each held key's K/V tensors in step with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from hstu_replay.cache_ledger import CacheLedger, LedgerOutcome


@dataclass(frozen=True)
class CacheEntry:
    """One user's history K/V, each [layers, tokens, heads, head_dim]."""

    k: Tensor
    v: Tensor

    @property
    def tokens(self) -> int:
        return int(self.k.shape[1])


@dataclass
class CacheCounters:
    """What a target cache did since it started or was last cleared (the control model's and /metrics' figures)."""

    hit_tokens: int = 0
    computed_tokens: int = 0
    evicted_users: int = 0
    requests: int = 0

    def count(self, outcome: LedgerOutcome, total_history_lengths: Sequence[int]) -> None:
        """One request the ledger served."""
        self.evicted_users += len(outcome.evicted)
        self.requests += 1
        for hit, total in zip(outcome.hits, total_history_lengths):
            self.hit_tokens += hit
            self.computed_tokens += total - hit

    def stats(self, ledger: CacheLedger, resident_users: int) -> dict[str, int]:
        return {
            "hit_tokens": self.hit_tokens,
            "computed_tokens": self.computed_tokens,
            "evicted_users": self.evicted_users,
            "requests": self.requests,
            "resident_users": resident_users,
            "resident_tokens": ledger.resident_tokens,
            "used_pages": ledger.resident_pages,
            "budget_pages": -1 if ledger.budget_pages is None else ledger.budget_pages,
            "page_tokens": ledger.page_tokens,
        }


class KVCache:
    def __init__(self, max_tokens: int | None, page_tokens: int = 32) -> None:
        self.ledger = CacheLedger(max_tokens, page_tokens)
        self._entries: dict[int, CacheEntry] = {}
        self.counters = CacheCounters()

    def held(self, key: int) -> int:
        return self.ledger.held(key)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[int]:
        """Held keys, least recently used first."""
        return self.ledger.keys()

    def check_request(self, keys: Sequence[int], total_history_lengths: Sequence[int]) -> None:
        """Refuse what the published server would silently get wrong; touches nothing."""
        self.ledger.check(list(zip(keys, total_history_lengths)))

    def begin(self, keys: Sequence[int], total_history_lengths: Sequence[int]) -> list[tuple[int, CacheEntry | None]]:
        """Account one request; per user, the tokens to reuse and the entry holding them."""
        entries = [self._entries.get(k) for k in keys]
        outcome = self.ledger.serve(list(zip(keys, total_history_lengths)))
        for key in outcome.evicted:
            self._entries.pop(key, None)
        self.counters.count(outcome, total_history_lengths)
        return list(zip(outcome.hits, entries))

    def store(self, key: int, k: Tensor, v: Tensor) -> bool:
        """Keep `key`'s K/V if the ledger holds exactly that history for it; else drop it."""
        if self.ledger.held(key) == int(k.shape[1]):
            self._entries[key] = CacheEntry(k, v)
            return True
        self._entries.pop(key, None)
        return False

    def forget(self, key: int) -> None:
        """Hold nothing for `key` (a request that failed half-way)."""
        self.ledger.forget(key)
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Drop every entry and zero the counters: what a server restart does."""
        self.ledger.clear()
        self._entries.clear()
        self.counters = CacheCounters()

    def stats(self) -> dict[str, int]:
        return self.counters.stats(self.ledger, len(self._entries))
