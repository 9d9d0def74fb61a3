"""The client's model of a two-tier KV cache, NVIDIA's rules: a GPU pool and a host pool behind it.

Both pools are LRU ledgers of whole users in pages (`CacheLedger`), each with its own budget.
After a request every user of it holds its total_history_length on the GPU (whatever it found,
its sequence is now resident there). What reaches the host depends on the offload mode:

- `flexkv` (FlexKV): every user of a request is offloaded after its forward pass, so the host
  holds the whole sequence too;
- `native` (NVIDIA's native host storage): a user is offloaded in whole chunks (`--offload-chunk-tokens`,
  1,024 by default, as the server's), once a chunk is complete; the host holds the completed chunks.

The rule is the server's own (`cache_ledger.OFFLOAD_RULES`, which its host tier applies).

A request's lookup merges the tiers: GPU-only and host-only hits as they are; both: the longer
one, with no gap (histories start at 0 here, so the merged length is max(host, GPU)). A host
copy longer than the GPU's onboards the whole sequence: those tokens are host hits
(`HOST_CACHED_TOKENS`), the rest of the reuse is a GPU hit. A user evicted from both is
recomputed: a miss. A host pool of 0 tokens is no host tier: the model is the one-tier ledger.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from hstu_replay.cache_ledger import (
    DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS, OFFLOAD_RULES, CacheLedger, OffloadMode,
)


class Tier(enum.Enum):
    """Where a user's reused tokens came from."""

    GPU = "gpu"
    HOST = "host"
    MISS = "miss"  # nothing reused: recomputed


#: --offload-mode name -> its mode
OFFLOAD_MODES: dict[str, OffloadMode] = {m.value: m for m in OffloadMode}


def host_tokens(mode: str, held: int, tokens: int, chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS) -> int:
    """Tokens the host holds after a forward pass over `tokens` of a user it held `held` of
    (never fewer than it held)."""
    return max(held, OFFLOAD_RULES[OFFLOAD_MODES[mode]](held, tokens, chunk_tokens))


@dataclass(frozen=True)
class TierHits:
    """Tokens reused per user of a request: all of them (`hits`) and the part onboarded from the host."""

    hits: tuple[int, ...]
    host: tuple[int, ...]

    @property
    def gpu(self) -> tuple[int, ...]:
        return tuple(h - o for h, o in zip(self.hits, self.host))

    def tiers(self) -> tuple[Tier, ...]:
        return tuple(tier_of(h, o) for h, o in zip(self.hits, self.host))


def tier_of(hits: int, host: int) -> Tier:
    """The tier of one user's reuse: host if anything was onboarded, GPU if it reused anything else."""
    return Tier.HOST if host > 0 else Tier.GPU if hits > 0 else Tier.MISS


class TierModel:
    """GPU pool + host pool, NVIDIA's lookup, onboard and offload rules."""

    def __init__(self, gpu_budget_tokens: int | None, host_budget_tokens: int = 0,
                 page_tokens: int = DEFAULT_PAGE_TOKENS,
                 offload_mode: str = "flexkv", chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS):
        if offload_mode not in OFFLOAD_MODES or chunk_tokens < 1:
            raise ValueError(f"offload mode {offload_mode!r} with chunks of {chunk_tokens} tokens")
        self.gpu = CacheLedger(gpu_budget_tokens, page_tokens)
        self.host = CacheLedger(host_budget_tokens, page_tokens) if host_budget_tokens > 0 else None
        self.offload_mode, self.chunk_tokens = offload_mode, chunk_tokens

    def lookup(self, key: int, tokens: int) -> tuple[int, int]:
        """(tokens reused, of which onboarded from the host) for a user of `tokens` history tokens."""
        on_gpu = self.gpu.held(key)
        on_host = self.host.held(key) if self.host is not None else 0
        if on_host > on_gpu:  # the whole sequence comes from the host
            hit = min(on_host, tokens)
            return hit, hit
        return min(on_gpu, tokens), 0

    def where(self, key: int) -> Tier:
        """Where `key` would hit now (MISS: held by neither pool)."""
        hit, host = self.lookup(key, 1 << 62)
        return tier_of(hit, host)

    def held(self, key: int) -> int:
        return self.lookup(key, 1 << 62)[0]

    def serve(self, request: Sequence[tuple[int, int]]) -> TierHits:
        """Account one request of (key, total_history_length) pairs."""
        found = [self.lookup(k, t) for k, t in request]  # read before serving: serve checks the request first
        self.gpu.serve(request)
        if self.host is not None:
            held = self.host.held
            self.host.serve([(k, host_tokens(self.offload_mode, held(k), t, self.chunk_tokens)) for k, t in request])
        return TierHits(tuple(h for h, _ in found), tuple(o for _, o in found))

    def forget(self, key: int) -> None:
        self.gpu.forget(key)
        if self.host is not None:
            self.host.forget(key)

    def clear(self) -> None:
        self.gpu.clear()
        if self.host is not None:
            self.host.clear()

    @property
    def bounded(self) -> bool:
        return self.gpu.budget_pages is not None
