"""Token bookkeeping of an HSTU KV cache: what each key holds, LRU eviction under a page budget.

The server's semantics (NVIDIA's, and our reference target's): a request's user reuses
min(held, total_history_length) tokens; afterwards its key holds total_history_length tokens;
whole users are evicted least-recently-used when the pages would exceed the budget; users of
the running request are never evicted. The reference target keeps its tensors beside this
ledger; the load generator runs the same ledger as its model of the server's capacity.

The offload rule of a host tier behind the cache (what the host holds after a forward pass) is
here too, for the same two readers: the server's host tier and the client's tier model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from hstu_replay.errors import LimitError


#: The KV-cache page in tokens, server and client alike, unless --page-tokens / --cache-page-tokens say otherwise.
DEFAULT_PAGE_TOKENS = 32


#: NVIDIA's published KV pool in pages (of `DEFAULT_PAGE_TOKENS`), and so the reference server's
#: budget unless --cache-budget-tokens says otherwise.
PUBLISHED_POOL_PAGES = 102_400
DEFAULT_POOL_TOKENS = PUBLISHED_POOL_PAGES * DEFAULT_PAGE_TOKENS


#: NVIDIA's native host storage offloads in chunks of this many tokens (`offload_chunksize`): the
#: server's and the client's --offload-chunk-tokens unless given.
DEFAULT_OFFLOAD_CHUNK_TOKENS = 1024


class OffloadMode(str, Enum):
    """--offload-mode: when K/V go to the host tier, under NVIDIA's backend names."""

    FLEXKV = "flexkv"  # after every forward pass, everything not yet on the host
    NATIVE = "native"  # once a whole chunk is not yet on the host, whole chunks


#: (tokens on the host, tokens the user has now, chunk) -> tokens on the host after the offload
OFFLOAD_RULES: dict[OffloadMode, Callable[[int, int, int], int]] = {
    OffloadMode.NATIVE: lambda held, total, chunk: held + (total - held) // chunk * chunk,
    OffloadMode.FLEXKV: lambda held, total, chunk: total,
}


def pages(tokens: int, page_tokens: int) -> int:
    return -(-tokens // page_tokens)


@dataclass(frozen=True)
class LedgerOutcome:
    hits: tuple[int, ...]  # tokens reused, per user of the request
    evicted: tuple[int, ...]  # keys evicted to make room
    dropped: tuple[int, ...]  # keys too large for the whole budget: served, not kept


class CacheLedger:
    def __init__(self, budget_tokens: int | None = None, page_tokens: int = DEFAULT_PAGE_TOKENS):
        if page_tokens < 1:
            raise LimitError(f"page size {page_tokens} tokens; must be at least 1")
        self.page_tokens = page_tokens
        self.budget_pages = None if budget_tokens is None else budget_tokens // page_tokens
        self._held: OrderedDict[int, int] = OrderedDict()  # key -> tokens, least recent first
        self._pages = 0

    def held(self, key: int) -> int:
        return self._held.get(key, 0)

    @property
    def resident_tokens(self) -> int:
        return sum(self._held.values())

    @property
    def resident_pages(self) -> int:
        return self._pages

    def __len__(self) -> int:
        return len(self._held)

    def keys(self) -> list[int]:
        """Held keys, least recently used first."""
        return list(self._held)

    def check(self, request: Sequence[tuple[int, int]]) -> None:
        """Refuse what the published server would silently get wrong."""
        seen = set()
        for key, tokens in request:
            if key in seen:
                raise LimitError(f"cache key {key} appears twice in one request")
            seen.add(key)
            if tokens < self.held(key):
                raise LimitError(
                    f"cache key {key}: history of {tokens} tokens is shorter than the {self.held(key)} held"
                )

    def serve(self, request: Sequence[tuple[int, int]]) -> LedgerOutcome:
        """Account one request of (key, total_history_length) pairs; returns hits per user."""
        self.check(request)
        hits = tuple(min(self.held(k), t) for k, t in request)
        dropped = []
        for key, tokens in request:
            self._pages -= pages(self._held.pop(key, 0), self.page_tokens)
            if self.budget_pages is not None and pages(tokens, self.page_tokens) > self.budget_pages:
                dropped.append(key)
                continue
            self._held[key] = tokens
            self._pages += pages(tokens, self.page_tokens)
        evicted = []
        if self.budget_pages is not None:
            # The request's own keys were just (re)inserted, so they are the most recent: evict
            # from the least recent end until the budget holds or only they remain. O(evicted).
            protected = {k for k, _ in request}
            while self._pages > self.budget_pages and self._held:
                key = next(iter(self._held))
                if key in protected:
                    break
                self._pages -= pages(self._held.pop(key), self.page_tokens)
                evicted.append(key)
            # Only the running request's own users remain: drop the oldest of them.
            while self._pages > self.budget_pages and self._held:
                key, tokens = self._held.popitem(last=False)
                self._pages -= pages(tokens, self.page_tokens)
                dropped.append(key)
        return LedgerOutcome(hits, tuple(evicted), tuple(dropped))

    def forget(self, key: int) -> None:
        self._pages -= pages(self._held.pop(key, 0), self.page_tokens)

    def clear(self) -> None:
        self._held.clear()
        self._pages = 0
