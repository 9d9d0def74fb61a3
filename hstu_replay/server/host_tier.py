"""The host tier behind the target's KV cache: what a user keeps when the primary (GPU) pool evicts it.

NVIDIA's semantics (recsys-examples at 43465ae: `KVLookupResult.merge` in kvcache_utils.py, the
native host storage, FlexKV), as the reference target serves them:
- Offload, two modes under NVIDIA's backend names: `flexkv` offloads every user of a request after
  its forward pass (all tokens not yet on the host); `native` offloads only once at least
  `chunk_tokens` (`--offload-chunk-tokens`) tokens are not yet on the host, and then whole chunks
  of that size. The rule is `cache_ledger.OFFLOAD_RULES`, the client's tier model's too.
  Offloading copies the K/V out of the primary pool while the request's pages still hold it.
- Lookup merges the tiers: hit = max(host_len, gpu_len). The primary pool always holds a user
  from its first token (gpu_start 0), so there is never a gap, and NVIDIA's eviction of a user
  whose host copy starts before its GPU copy cannot arise. When the host holds more than the
  primary pool, the whole host sequence is onboarded ("we onboard the full sequence"): a real
  copy into the pool (from pinned host memory on CUDA); that part is the request's host hit.
- Its own budget, rounded to pages like the primary pool's, LRU per user: after a request's
  forward pass its users become the most recent, in request order, and the host evicts for them
  as the primary pool does for a request (its own users protected from each other). A user
  evicted from both is recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, OFFLOAD_RULES, CacheLedger, OffloadMode
from hstu_replay.errors import LimitError


@dataclass(frozen=True)
class KVLayout:
    """Shape of one token's K/V in any tier: [layers, tokens, heads, head_dim] tensors of `dtype`."""

    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class TierLookup:
    """Per user of a request: tokens the primary pool and the host tier hold for it (capped by its history)."""

    gpu: tuple[int, ...]
    host: tuple[int, ...]

    @property
    def hits(self) -> tuple[int, ...]:
        """Tokens reused, both tiers merged (no gap: both start at token 0)."""
        return tuple(max(g, h) for g, h in zip(self.gpu, self.host))

    @property
    def onboarded(self) -> tuple[int, ...]:
        """Tokens onboarded from the host: its whole sequence where it holds more than the primary pool."""
        return tuple(h if h > g else 0 for g, h in zip(self.gpu, self.host))


#: (start, end) -> K and V of those tokens of one user, each [layers, end - start, heads, head_dim]
Reader = Callable[[int, int], tuple[Tensor, Tensor]]


class Offload(NamedTuple):
    """One user of a request after its forward pass: its key, its tokens now, and where to read them."""

    key: int
    total: int
    read: Reader


@dataclass
class TierCounters:
    host_hit_tokens: int = 0
    onboarded_bytes: int = 0
    onboard_micros: int = 0
    offloaded_bytes: int = 0
    offload_micros: int = 0
    host_evicted_users: int = 0


@dataclass
class HostEntry:
    """One user's offloaded K/V: chunks in token order, each a pair of [layers, n, heads, head_dim]."""

    chunks: list[tuple[Tensor, Tensor]] = field(default_factory=list)


def sync(device: torch.device) -> None:
    """Wait for the copies queued on `device` (timings of a copy include its completion)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class HostTier:
    def __init__(self, budget_tokens: int, page_tokens: int, mode: OffloadMode, layout: KVLayout,
                 device: str | torch.device, chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS) -> None:
        if budget_tokens < 1:
            raise LimitError(f"host tier of {budget_tokens} tokens; give at least 1 (0 means no host tier)")
        if chunk_tokens < 1:
            raise LimitError(f"offload chunk of {chunk_tokens} tokens; must be at least 1")
        self.ledger = CacheLedger(budget_tokens, page_tokens)
        self.mode = OffloadMode(mode)
        self.layout = layout
        self.device = torch.device(device)
        self.chunk_tokens = chunk_tokens
        self.pinned = self.device.type == "cuda"
        self._entries: dict[int, HostEntry] = {}
        self.counters = TierCounters()

    @property
    def budget_tokens(self) -> int:
        return self.ledger.budget_pages * self.ledger.page_tokens

    def held(self, key: int) -> int:
        return self.ledger.held(key)

    def check(self, keys: Sequence[int], totals: Sequence[int]) -> None:
        """A history shorter than what the host holds would reuse stale K/V: refuse it, as the primary pool does."""
        self.ledger.check(list(zip(keys, totals)))

    def lookup(self, keys: Sequence[int], totals: Sequence[int], gpu_hits: Sequence[int]) -> TierLookup:
        """Merge the tiers for one request (the host's order changes at `offload`)."""
        host = tuple(min(self.held(k), t) for k, t in zip(keys, totals))
        result = TierLookup(tuple(gpu_hits), host)
        self.counters.host_hit_tokens += sum(result.onboarded)
        return result

    def onboard(self, key: int, tokens: int, write: Callable[[int, Tensor, Tensor], None]) -> None:
        """Copy the first `tokens` host tokens of `key` to the device: `write(start, k, v)` per chunk."""
        started = time.perf_counter()
        start = 0
        for k, v in self._entries[key].chunks:
            if start >= tokens:
                break
            n = min(int(k.shape[1]), tokens - start)
            write(start, k[:, :n].to(self.device, non_blocking=True), v[:, :n].to(self.device, non_blocking=True))
            start += n
        sync(self.device)
        self.counters.onboarded_bytes += tokens * self.layout.bytes_per_token
        self.counters.onboard_micros += round((time.perf_counter() - started) * 1e6)

    def offload(self, users: Sequence[Offload]) -> int:
        """After a request's forward pass: offload what the mode says of each of its users, then
        account the request in the host's LRU at once (its users the most recent, in request
        order, protected from each other's eviction). Returns the tokens offloaded now."""
        started = time.perf_counter()
        request, copies, moved = [], {}, 0
        for key, total, read in users:
            held = self.held(key)
            target = OFFLOAD_RULES[self.mode](held, total, self.chunk_tokens)
            if target > held:
                k, v = read(held, target)
                copies[key] = (target, (self._host_copy(k), self._host_copy(v)))
                moved += target - held
            if target:  # a user with nothing on the host and nothing to offload takes no place in it
                request.append((key, target))
        if not request:
            return 0
        sync(self.device)
        outcome = self.ledger.serve(request)
        for gone in outcome.evicted + outcome.dropped:
            self._entries.pop(gone, None)
        self.counters.host_evicted_users += len(outcome.evicted)
        for key, (target, chunk) in copies.items():
            if self.ledger.held(key) == target:
                self._entries.setdefault(key, HostEntry()).chunks.append(chunk)
        self.counters.offloaded_bytes += moved * self.layout.bytes_per_token
        self.counters.offload_micros += round((time.perf_counter() - started) * 1e6)
        return moved

    def _host_copy(self, t: Tensor) -> Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pinned)
        out.copy_(t, non_blocking=self.pinned)
        return out

    def forget(self, key: int) -> None:
        self.ledger.forget(key)
        self._entries.pop(key, None)

    def clear(self) -> None:
        self.ledger.clear()
        self._entries.clear()
        self.counters = TierCounters()

    def stats(self) -> dict[str, int]:
        c = self.counters
        return {
            "host_hit_tokens": c.host_hit_tokens,
            "host_resident_tokens": self.ledger.resident_tokens,
            "host_resident_users": len(self.ledger),
            "host_evicted_users": c.host_evicted_users,
            "onboarded_bytes": c.onboarded_bytes,
            "onboard_micros": c.onboard_micros,
            "offloaded_bytes": c.offloaded_bytes,
            "offload_micros": c.offload_micros,
            "host_budget_tokens": self.budget_tokens,
            "host_resident_bytes": self.ledger.resident_tokens * self.layout.bytes_per_token,
            "host_budget_bytes": self.budget_tokens * self.layout.bytes_per_token,
        }


#: What a cache without a host tier reports for the host's figures.
NO_HOST_STATS = dict.fromkeys(
    ("host_hit_tokens", "host_resident_tokens", "host_resident_users", "host_evicted_users", "onboarded_bytes",
     "onboard_micros", "offloaded_bytes", "offload_micros", "host_budget_tokens", "host_resident_bytes",
     "host_budget_bytes"), 0)


def host_stats(host: HostTier | None) -> dict[str, int]:
    return NO_HOST_STATS if host is None else host.stats()
