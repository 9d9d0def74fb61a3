"""The batched engine's KV cache: one pool of fixed-size pages per layer, and a page table per user.

Semantics are the `CacheLedger`'s (the same ledger the load generator models the server with);
this class maps each key the ledger holds to the pool pages that hold its tokens. A cached
user's new tokens go on after its last token, in its last partly filled page and then in fresh
pages, so a hit never copies anything. The pool has room for the ledger's whole budget plus one
full request, so a request's users always have pages to compute in, kept or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hstu_replay.cache_ledger import CacheLedger, pages
from hstu_replay.errors import LimitError
from hstu_replay.server.config import ModelConfig
from hstu_replay.server.kvcache import CacheCounters


@dataclass(frozen=True)
class UserPages:
    """One user of the running request: tokens reused, and the pages holding all its tokens."""

    key: int
    hit: int
    total: int
    pages: tuple[int, ...]


class PagedKVCache:
    def __init__(self, config: ModelConfig, budget_tokens: int, page_tokens: int, device: str | torch.device,
                 dtype: torch.dtype) -> None:
        if budget_tokens < 0:
            raise LimitError(f"KV-cache budget of {budget_tokens} tokens; must be at least 0")
        self.ledger = CacheLedger(budget_tokens, page_tokens)
        self.page_tokens = page_tokens
        request_pages = config.max_batch * pages(config.max_history_tokens, page_tokens)
        self.num_pages = self.ledger.budget_pages + request_pages
        shape = (config.num_layers, self.num_pages * page_tokens, config.num_heads, config.head_dim)
        # K and V of token slot s (page s // page_tokens) at layer l: pool_k[l, s], pool_v[l, s]
        try:
            self.pool_k = torch.empty(shape, dtype=dtype, device=device)
            self.pool_v = torch.empty(shape, dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            gib = 2 * torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() / 2**30
            raise LimitError(f"the KV pool ({budget_tokens} tokens + one request: {gib:.1f} GiB) does not fit "
                             f"on {device}; lower --cache-budget-tokens ({str(exc).splitlines()[0]})") from None
        self._pages: dict[int, list[int]] = {}  # key -> its pages, in token order
        self._free = list(range(self.num_pages - 1, -1, -1))  # a stack: low pages first
        self.counters = CacheCounters()

    def held(self, key: int) -> int:
        return self.ledger.held(key)

    def check_request(self, keys: Sequence[int], totals: Sequence[int]) -> None:
        self.ledger.check(list(zip(keys, totals)))

    def begin(self, keys: Sequence[int], totals: Sequence[int]) -> list[UserPages]:
        """Account one request and give each user pages for all its tokens (cached ones first)."""
        outcome = self.ledger.serve(list(zip(keys, totals)))
        for key in outcome.evicted:
            self._release(key)
        self.counters.count(outcome, totals)
        users = []
        for key, total, hit in zip(keys, totals, outcome.hits):
            owned = self._pages.setdefault(key, [])
            for _ in range(pages(total, self.page_tokens) - len(owned)):
                owned.append(self._free.pop())
            users.append(UserPages(key, hit, total, tuple(owned)))
        return users

    def finish(self, keys: Sequence[int]) -> None:
        """After the request of `keys`: release the pages of its users the ledger did not keep.

        Only they can hold pages unkept: `begin` releases evicted users, `forget` failed ones."""
        for key in keys:
            if self.ledger.held(key) == 0:
                self._release(key)

    def forget(self, key: int) -> None:
        """Hold nothing for `key` (a request that failed half-way)."""
        self.ledger.forget(key)
        self._release(key)

    def clear(self) -> None:
        self.ledger.clear()
        for key in list(self._pages):
            self._release(key)
        self.counters = CacheCounters()

    def _release(self, key: int) -> None:
        self._free.extend(reversed(self._pages.pop(key, [])))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def stats(self) -> dict[str, int]:
        return self.counters.stats(self.ledger, len(self.ledger))
