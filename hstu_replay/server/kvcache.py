"""The target's per-user KV cache: tensors kept beside a `CacheLedger` that decides everything.

The ledger (shared with the load generator's capacity model, so both predict the same hits)
owns the semantics: what a request reuses, what each key holds afterwards, which users are
evicted, least recently used first, under a page-rounded budget, with the running request's
users protected. This class only keeps each held key's K/V tensors in step with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS, CacheLedger
from hstu_replay.server.host_tier import HostTier, KVLayout, Offload, TierLookup, host_stats


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

    def count(self, hits: Sequence[int], evicted_users: int, total_history_lengths: Sequence[int]) -> None:
        """One request served: tokens reused per user (both tiers), users the primary pool evicted."""
        self.evicted_users += evicted_users
        self.requests += 1
        for hit, total in zip(hits, total_history_lengths):
            self.hit_tokens += hit
            self.computed_tokens += total - hit

    def stats(self, ledger: CacheLedger, resident_users: int, host: HostTier | None) -> dict[str, int]:
        """The primary pool's figures (hit tokens are both tiers'), then the host tier's."""
        budget = ledger.budget_pages
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
            "gpu_budget_tokens": -1 if budget is None else int64_or_unknown(budget * ledger.page_tokens),
        } | host_stats(host)


def int64_or_unknown(value: int) -> int:
    """A figure as the control model's INT64 carries it: -1 where it does not fit (an unbounded budget)."""
    return value if value < 2**63 else -1


def merge_tiers(ledger_hits: Sequence[int], keys: Sequence[int], totals: Sequence[int],
                host: HostTier | None) -> TierLookup:
    """Both tiers' holdings for one request (no host tier: the primary pool's alone)."""
    if host is None:
        return TierLookup(tuple(ledger_hits), (0,) * len(ledger_hits))
    return host.lookup(keys, totals, ledger_hits)


@dataclass(frozen=True)
class Reuse:
    """One user of a request in the per-user cache: tokens reused, the entry holding them, the part onboarded."""

    hit: int
    entry: CacheEntry | None
    onboarded: int


class KVCache:
    """`host`: the tier behind it (None: none); `layout` sizes its memory figures (None: they read -1)."""

    def __init__(self, max_tokens: int | None, page_tokens: int = DEFAULT_PAGE_TOKENS, host: HostTier | None = None,
                 layout: KVLayout | None = None) -> None:
        self.ledger = CacheLedger(max_tokens, page_tokens)
        self.host = host
        self.layout = layout
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
        if self.host is not None:
            self.host.check(keys, total_history_lengths)

    def begin(self, keys: Sequence[int], total_history_lengths: Sequence[int]) -> list[Reuse]:
        """Account one request; per user, the tokens to reuse and the entry holding them (onboarded
        from the host tier where it holds more than the primary pool)."""
        entries = [self._entries.get(k) for k in keys]
        outcome = self.ledger.serve(list(zip(keys, total_history_lengths)))
        for key in outcome.evicted:
            self._entries.pop(key, None)
        lookup = merge_tiers(outcome.hits, keys, total_history_lengths, self.host)
        for i, (key, onboarded) in enumerate(zip(keys, lookup.onboarded)):
            if onboarded:
                entries[i] = self._onboard(key, onboarded)
        self.counters.count(lookup.hits, len(outcome.evicted), total_history_lengths)
        return [Reuse(*r) for r in zip(lookup.hits, entries, lookup.onboarded)]

    def _onboard(self, key: int, tokens: int) -> CacheEntry:
        lay = self.host.layout
        shape = (lay.layers, tokens, lay.heads, lay.head_dim)
        k, v = (torch.empty(shape, dtype=lay.dtype, device=self.host.device) for _ in range(2))

        def write(start: int, k_part: Tensor, v_part: Tensor) -> None:
            k[:, start:start + k_part.shape[1]] = k_part
            v[:, start:start + v_part.shape[1]] = v_part

        self.host.onboard(key, tokens, write)
        return CacheEntry(k, v)

    def store(self, key: int, k: Tensor, v: Tensor) -> bool:
        """After a user's forward pass: keep `key`'s K/V if the ledger holds exactly that history
        for it; else drop it."""
        if self.ledger.held(key) == int(k.shape[1]):
            self._entries[key] = CacheEntry(k, v)
            return True
        self._entries.pop(key, None)
        return False

    def offload(self, users: Sequence[tuple[int, Tensor, Tensor]]) -> None:
        """After a request's forward pass, its users' (key, K, V): to the host tier, what its mode says."""
        if self.host is None:
            return

        def reader(k: Tensor, v: Tensor):
            return lambda start, end: (k[:, start:end], v[:, start:end])

        self.host.offload([Offload(key, int(k.shape[1]), reader(k, v)) for key, k, v in users])

    def forget(self, key: int) -> None:
        """Hold nothing for `key` (a request that failed half-way)."""
        self.ledger.forget(key)
        self._entries.pop(key, None)
        if self.host is not None:
            self.host.forget(key)

    def clear(self) -> None:
        """Drop every entry (both tiers) and zero the counters: what a server restart does."""
        self.ledger.clear()
        self._entries.clear()
        self.counters = CacheCounters()
        if self.host is not None:
            self.host.clear()

    def stats(self) -> dict[str, int]:
        """Memory: the bytes the entries hold now, and the budget's (-1 without a layout or a budget)."""
        budget = self.ledger.budget_pages
        resident = sum(e.k.nbytes + e.v.nbytes for e in self._entries.values())
        per_token = -1 if self.layout is None else self.layout.bytes_per_token
        return self.counters.stats(self.ledger, len(self._entries), self.host) | {
            "resident_bytes": resident,
            "budget_bytes": -1 if budget is None or per_token < 0 else int64_or_unknown(
                budget * self.ledger.page_tokens * per_token),
        }
