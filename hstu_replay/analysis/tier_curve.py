"""The token hit ratio of a trace per cache tier, over a grid of (GPU budget, host budget): one pass.

Both pools are LRU over the same accesses (`plan.tiers`: every user of a request is touched in
both), so each is a stack: a returning user is held by a pool exactly when its budget covers the
user's own pages and the current pages of every distinct user seen since its last visit (its
threshold, `cache_curve.return_thresholds`). The GPU pool holds whole histories; the host pool
holds what the offload mode put there (`flexkv`: the whole history, the same threshold; `native`:
whole chunks of `--offload-chunk-tokens`, its own thresholds over those sizes). NVIDIA's lookup then gives,
for each return: a GPU hit when the GPU's budget covers its threshold (the GPU copy is never the
shorter one under either mode); else a host hit when the host's budget covers the host threshold
and the host holds anything; else a miss. With `flexkv` a host pool no larger than the GPU's adds
nothing (it holds copies of the same most recent users): NVIDIA's inclusion.

Exact, as the one-tier curve, for budgets that hold the largest request (`exact_from_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.analysis.cache_curve import Returns, return_thresholds
from hstu_replay.plan.tiers import host_tokens


@dataclass(frozen=True, eq=False)
class TierCurve:
    gpu: Returns  # per return: the GPU pool's threshold (pages) and the tokens it then finds
    host: Returns  # the same returns in the host pool
    total_tokens: int
    page_tokens: int
    offload_mode: str

    @property
    def exact_from_tokens(self) -> int:
        return max(self.gpu.largest_pages, self.host.largest_pages) * self.page_tokens

    def hit_tokens(self, gpu_budget_tokens: int, host_budget_tokens: int) -> tuple[int, int]:
        """(GPU hit tokens, host hit tokens) of the whole trace at these budgets."""
        on_gpu = self.gpu.thresholds <= gpu_budget_tokens // self.page_tokens
        gpu = int(self.gpu.hits[on_gpu].sum())
        if host_budget_tokens <= 0:
            return gpu, 0
        on_host = ~on_gpu & (self.host.thresholds <= host_budget_tokens // self.page_tokens) & (self.host.hits > 0)
        return gpu, int(self.host.hits[on_host].sum())

    def point(self, gpu_budget_tokens: int, host_budget_tokens: int) -> dict:
        gpu, host = self.hit_tokens(gpu_budget_tokens, host_budget_tokens)
        whole = self.total_tokens or 1
        return {"gpu_budget_tokens": gpu_budget_tokens, "host_budget_tokens": host_budget_tokens,
                "gpu_ratio": gpu / whole, "host_ratio": host / whole, "hit_ratio": (gpu + host) / whole,
                "exact": min(gpu_budget_tokens, host_budget_tokens or gpu_budget_tokens) >= self.exact_from_tokens}

    def grid(self, gpu_budgets: list[int], host_budgets: list[int]) -> list[dict]:
        return [self.point(g, h) for g in gpu_budgets for h in host_budgets]


def tier_curve(keys: np.ndarray, tokens: np.ndarray, bounds: np.ndarray, page_tokens: int = DEFAULT_PAGE_TOKENS,
               offload_mode: str = "flexkv", chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS) -> TierCurve:
    """The two-tier curve of a trace laid out as `cache_curve.return_thresholds` takes it. What the
    host holds after an access depends on its tokens only (under `native` every earlier copy is whole
    chunks of a shorter history, so the rule gives the same from it as from nothing)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    gpu = return_thresholds(keys, tokens, bounds, page_tokens)
    offloaded = np.fromiter((host_tokens(offload_mode, 0, int(t), chunk_tokens) for t in tokens), dtype=np.int64,
                            count=len(tokens))
    host = gpu if np.array_equal(offloaded, tokens) else return_thresholds(keys, offloaded, bounds, page_tokens)
    return TierCurve(gpu, host, int(tokens.sum()), page_tokens, offload_mode)
