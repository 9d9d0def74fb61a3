"""The batched engine's KV cache: one pool of fixed-size pages per layer, and a page table per user.

Semantics are the `CacheLedger`'s (the same ledger the load generator models the server with);
this class maps each key the ledger holds to the pool pages that hold its tokens. A cached
user's new tokens go on after its last token, in its last partly filled page and then in fresh
pages, so a hit never copies anything. The pool has room for the ledger's whole budget plus one
full request, so a request's users always have pages to compute in, kept or not.

Memory is taken as pages are used: the pool starts at one full request (or the whole pool when
that is smaller) and grows, when a request needs more pages than are free, to twice its size
(capped at the whole pool), copying what it holds; a full budget is refused at start only when it
exceeds the device's memory. Growing by copying holds the old pool and the new one at once (the
last growth 1.5 to 2 times the whole pool); `reserve` takes the whole pool at start instead, as
NVIDIA's runtime takes its primary pages: a budget the device cannot hold is then refused before
any request, and the pool never moves. With a host tier (`host_tier.HostTier`) behind it, a user the host
holds more of is onboarded into its pages at `begin`, and `offload` copies the request's users
out after the forward pass.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hstu_replay.cache_ledger import CacheLedger, pages
from hstu_replay.errors import LimitError
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.host_tier import HostTier, KVLayout, Offload
from hstu_replay.server.kvcache import CacheCounters, merge_tiers

GROWTH_FACTOR = 2  # a pool that must grow takes this many times its pages (at most the whole pool)


def device_memory_bytes(device: torch.device) -> int:
    """All the memory of `device`: a CUDA device's, or this machine's physical memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class UserPages:
    """One user of the running request: tokens reused, and the pages holding all its tokens."""

    key: int
    hit: int
    total: int
    pages: tuple[int, ...]
    onboarded: int = 0  # of the hit, tokens onboarded from the host tier


class PagedKVCache:
    def __init__(self, config: ModelConfig, budget_tokens: int, page_tokens: int, device: str | torch.device,
                 dtype: torch.dtype, host: HostTier | None = None, reserve: bool = False) -> None:
        if budget_tokens < 0:
            raise LimitError(f"KV-cache budget of {budget_tokens} tokens; must be at least 0")
        self.ledger = CacheLedger(budget_tokens, page_tokens)
        self.page_tokens = page_tokens
        self.host = host
        self.layout = KVLayout(config.num_layers, config.num_heads, config.head_dim, dtype)
        self.device = torch.device(device)
        request_pages = config.max_batch * pages(config.max_history_tokens, page_tokens)
        self.num_pages = self.ledger.budget_pages + request_pages  # the most the pool ever takes
        full = self.page_bytes * self.num_pages
        if full > device_memory_bytes(self.device):
            raise LimitError(f"the KV pool ({budget_tokens} tokens + one request: {full / 2**30:.1f} GiB) does not "
                             f"fit on {self.device} ({device_memory_bytes(self.device) / 2**30:.1f} GiB); "
                             f"lower --cache-budget-tokens")
        # K and V of token slot s (page s // page_tokens) at layer l: pool_k[l, s], pool_v[l, s]
        self.pool_k = self.pool_v = torch.empty((config.num_layers, 0, config.num_heads, config.head_dim),
                                                dtype=dtype, device=self.device)
        self._pages: dict[int, list[int]] = {}  # key -> its pages, in token order
        self._free: list[int] = []  # a stack of allocated free pages: low pages first
        self._rows: dict[int, np.ndarray] = {}  # key -> its pages as an array, made when first asked for
        self.counters = CacheCounters()
        self.generation = 0  # how many times the pool was (re)allocated: what holds its addresses checks this
        self._grow(self.num_pages if reserve else min(self.num_pages, request_pages))

    @property
    def page_bytes(self) -> int:
        return self.page_tokens * self.layout.bytes_per_token

    @property
    def allocated_pages(self) -> int:
        return int(self.pool_k.shape[1]) // self.page_tokens

    def _grow(self, to_pages: int) -> None:
        """Reallocate the pool with `to_pages` pages, keeping what it holds; new pages are free."""
        old = self.allocated_pages
        shape = (self.pool_k.shape[0], to_pages * self.page_tokens, *self.pool_k.shape[2:])
        try:
            grown = [torch.empty(shape, dtype=self.pool_k.dtype, device=self.device) for _ in range(2)]
        except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
            raise LimitError(f"the KV pool cannot grow to {to_pages * self.page_bytes / 2**30:.1f} GiB on "
                             f"{self.device}; lower --cache-budget-tokens ({str(exc).splitlines()[0]})") from None
        for new, pool in zip(grown, (self.pool_k, self.pool_v)):
            new[:, :pool.shape[1]] = pool
        self.pool_k, self.pool_v = grown
        self.generation += 1
        self._free[:0] = range(to_pages - 1, old - 1, -1)  # under the free ones: used after them

    def _reserve(self, needed: int) -> None:
        if needed > len(self._free):
            shortfall = needed - len(self._free)
            self._grow(min(self.num_pages, max(self.allocated_pages * GROWTH_FACTOR,
                                               self.allocated_pages + shortfall)))

    def held(self, key: int) -> int:
        return self.ledger.held(key)

    def check_request(self, keys: Sequence[int], totals: Sequence[int]) -> None:
        self.ledger.check(list(zip(keys, totals)))
        if self.host is not None:
            self.host.check(keys, totals)

    def begin(self, keys: Sequence[int], totals: Sequence[int]) -> list[UserPages]:
        """Account one request and give each user pages for all its tokens (cached ones first)."""
        outcome = self.ledger.serve(list(zip(keys, totals)))
        for key in outcome.evicted:
            self._release(key)
        lookup = merge_tiers(outcome.hits, keys, totals, self.host)
        self.counters.count(lookup.hits, len(outcome.evicted), totals)
        try:
            self._reserve(sum(pages(t, self.page_tokens) - len(self._pages.get(k, ())) for k, t in zip(keys, totals)))
        except LimitError:
            for key in keys:
                self.forget(key)
            raise
        users = []
        for key, total, hit, onboarded in zip(keys, totals, lookup.hits, lookup.onboarded):
            owned = self._pages.setdefault(key, [])
            for _ in range(pages(total, self.page_tokens) - len(owned)):
                owned.append(self._free.pop())
            users.append(UserPages(key, hit, total, tuple(owned), onboarded))
            if onboarded:
                self._onboard(users[-1])
        return users

    def slots(self, user_pages: Sequence[int], start: int, end: int) -> Tensor:
        """Pool slots of tokens [start, end) of a user with these pages, on the pool's device."""
        positions = torch.arange(start, end)
        table = torch.tensor(user_pages, dtype=torch.int64)
        return (table[positions // self.page_tokens] * self.page_tokens + positions % self.page_tokens).to(self.device)

    def _onboard(self, user: UserPages) -> None:
        def write(start: int, k: Tensor, v: Tensor) -> None:
            slots = self.slots(user.pages, start, start + int(k.shape[1]))
            for pool, part in ((self.pool_k, k), (self.pool_v, v)):
                # through [layers, slots, heads * head_dim] views: on a CPU torch's index_copy_ over the
                # 4-d pool is ~200x slower with 2 threads than over the same memory seen as 3-d
                pool.view(*pool.shape[:2], -1).index_copy_(1, slots, part.reshape(*part.shape[:2], -1))

        self.host.onboard(user.key, user.onboarded, write)

    def offload(self, users: Sequence[UserPages]) -> None:
        """After the forward pass of `users` (their pages hold all their tokens): offload to the host tier."""
        if self.host is None:
            return

        def reader(user: UserPages):
            def read(start: int, end: int) -> tuple[Tensor, Tensor]:
                slots = self.slots(user.pages, start, end)
                return self.pool_k.index_select(1, slots), self.pool_v.index_select(1, slots)
            return read

        self.host.offload([Offload(user.key, user.total, reader(user)) for user in users])

    def finish(self, keys: Sequence[int]) -> None:
        """After the request of `keys`: release the pages of its users the ledger did not keep.

        Only they can hold pages unkept: `begin` releases evicted users, `forget` failed ones."""
        for key in keys:
            if self.ledger.held(key) == 0:
                self._release(key)

    def forget(self, key: int) -> None:
        """Hold nothing for `key` in either tier (a request that failed half-way)."""
        self.ledger.forget(key)
        self._release(key)
        if self.host is not None:
            self.host.forget(key)

    def clear(self) -> None:
        """Empty both tiers and zero the counters; the pool keeps the memory it has taken."""
        self.ledger.clear()
        for key in list(self._pages):
            self._release(key)
        self.counters = CacheCounters()
        if self.host is not None:
            self.host.clear()

    def page_table(self, users: Sequence[UserPages]) -> np.ndarray:
        """The users' pages as the rows of one int64 table (short rows padded with page 0); a user's
        row is kept as an array while its pages stay the same, so a cached user costs no conversion."""
        rows = []
        for user in users:
            row = self._rows.get(user.key)
            if row is None or len(row) != len(user.pages):  # pages only grow while a key holds them
                row = self._rows[user.key] = np.array(user.pages, dtype=np.int64)
            rows.append(row)
        table = np.zeros((len(rows), max(len(row) for row in rows)), dtype=np.int64)
        for line, row in zip(table, rows):
            line[:len(row)] = row
        return table

    def _release(self, key: int) -> None:
        self._rows.pop(key, None)
        self._free.extend(reversed(self._pages.pop(key, [])))

    @property
    def free_pages(self) -> int:
        """Pages no user holds, whether the pool has taken their memory yet or not."""
        return len(self._free) + self.num_pages - self.allocated_pages

    def stats(self) -> dict[str, int]:
        """Memory: the bytes the pool has taken, and what it takes at its full size (budget + one request)."""
        return self.counters.stats(self.ledger, len(self.ledger), self.host) | {
            "resident_bytes": self.allocated_pages * self.page_bytes,
            "budget_bytes": self.num_pages * self.page_bytes,
        }
