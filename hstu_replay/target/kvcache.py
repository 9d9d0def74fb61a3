"""A per-user KV cache with NVIDIA's semantics, a page-rounded token budget and LRU eviction.

Semantics (the published server's): the cache is keyed by INPUT__3 alone and never checks
content. A request reuses min(held, its total_history_length) tokens of its key's entry, and
afterwards the key holds exactly its total_history_length tokens. Whole users are evicted,
least recently used first, when a new or grown entry would exceed the budget; the keys of the
running request are protected. An entry that cannot fit (larger than the whole budget, or
blocked by protected entries) is not stored, and the key's older entry is dropped with it.
Where the published server silently corrupts (a key twice in one request, a history shorter
than what is held) `check_request` refuses with a one-line error instead.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from torch import Tensor

from hstu_replay.errors import LimitError


@dataclass(frozen=True)
class CacheEntry:
    """One user's history K/V, each [layers, tokens, heads, head_dim]."""

    k: Tensor
    v: Tensor

    @property
    def tokens(self) -> int:
        return int(self.k.shape[1])


class KVCache:
    def __init__(self, max_tokens: int, page_tokens: int = 32) -> None:
        if max_tokens < 0 or page_tokens < 1:
            raise LimitError(f"KV cache budget {max_tokens} tokens in pages of {page_tokens}: both must be positive")
        self.page_tokens = page_tokens
        self.budget_pages = max_tokens // page_tokens  # a partial page cannot be used
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # oldest use first
        self._used_pages = 0
        self._protected: frozenset[int] = frozenset()
        self.hit_tokens = self.computed_tokens = self.evicted_users = self.requests = 0

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    def held(self, key: int) -> int:
        """Tokens held for `key` (0 if none); does not count as a use."""
        entry = self._entries.get(key)
        return 0 if entry is None else entry.tokens

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[int]:
        """Held keys, least recently used first."""
        return list(self._entries)

    def check_request(self, keys: Sequence[int], total_history_lengths: Sequence[int]) -> None:
        """Refuse what the published server would silently get wrong; touches nothing."""
        seen: set[int] = set()
        for key, total in zip(keys, total_history_lengths):
            if key in seen:
                raise LimitError(f"cache key {key} appears twice in one request; its KV entry would be corrupted")
            seen.add(key)
            held = self.held(key)
            if total < held:
                raise LimitError(
                    f"cache key {key}: history of {total} tokens is shorter than the {held} held; "
                    "a key's history may only grow (use a new cache key to start over)"
                )

    @contextlib.contextmanager
    def protect(self, keys: Iterable[int]) -> Iterator[None]:
        """Keep `keys` (the running request's) from eviction, and count one request."""
        previous = self._protected
        self._protected = previous | frozenset(keys)
        self.requests += 1
        try:
            yield
        finally:
            self._protected = previous

    def lookup(self, key: int) -> CacheEntry | None:
        """The held entry, marked as just used."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def store(self, key: int, k: Tensor, v: Tensor) -> bool:
        """Hold `k`/`v` as `key`'s whole entry, evicting LRU users as needed; False if not stored."""
        old = self._entries.pop(key, None)
        if old is not None:
            self._used_pages -= self.pages(old.tokens)
        need = self.pages(int(k.shape[1]))
        if need > self.budget_pages:
            return False
        victims = self._victims(need)
        if victims is None:
            return False
        for victim in victims:
            self._used_pages -= self.pages(self._entries.pop(victim).tokens)
            self.evicted_users += 1
        self._entries[key] = CacheEntry(k, v)
        self._used_pages += need
        return True

    def _victims(self, need: int) -> list[int] | None:
        """LRU-first unprotected keys whose eviction frees room for `need` pages (None: impossible)."""
        free = self.budget_pages - self._used_pages
        victims: list[int] = []
        for key, entry in self._entries.items():
            if free >= need:
                break
            if key not in self._protected:
                victims.append(key)
                free += self.pages(entry.tokens)
        return victims if free >= need else None

    def record(self, hit_tokens: int, computed_tokens: int) -> None:
        self.hit_tokens += hit_tokens
        self.computed_tokens += computed_tokens

    def clear(self) -> None:
        """Drop every entry and zero the counters: what a server restart does."""
        self._entries.clear()
        self._used_pages = 0
        self.hit_tokens = self.computed_tokens = self.evicted_users = self.requests = 0

    def stats(self) -> dict[str, int]:
        return {
            "hit_tokens": self.hit_tokens,
            "computed_tokens": self.computed_tokens,
            "evicted_users": self.evicted_users,
            "requests": self.requests,
            "resident_users": len(self._entries),
            "resident_tokens": sum(e.tokens for e in self._entries.values()),
            "used_pages": self._used_pages,
            "budget_pages": self.budget_pages,
            "page_tokens": self.page_tokens,
        }
