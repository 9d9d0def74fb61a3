"""The client's model of the server's KV cache: the hits each request should find, per tier,
predicted before it is sent (NVIDIA's semantics, through `TierModel`: a GPU pool and, with a host
budget, a host pool behind it), and keys whose server state is unknown after a failure forgotten."""

from __future__ import annotations

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS
from hstu_replay.plan.tiers import Tier, TierHits, TierModel
from hstu_replay.request import RequestTensors


class CacheModel:
    def __init__(self, budget_tokens: int | None, page_tokens: int, host_budget_tokens: int = 0,
                 offload_mode: str = "flexkv", chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS):
        self.tiers = TierModel(budget_tokens, host_budget_tokens, page_tokens, offload_mode, chunk_tokens)
        self.ledger = self.tiers.gpu

    def predict_tiers(self, request: RequestTensors) -> TierHits:
        """Tokens each user of `request` should find, and the part onboarded from the host; the
        model then holds what the server holds after it."""
        pairs = zip(request.user_ids.tolist(), request.total_history_lengths.tolist())
        return self.tiers.serve(list(pairs))

    def predict(self, request: RequestTensors) -> tuple[int, ...]:
        """Tokens each user of `request` should find, both tiers together."""
        return self.predict_tiers(request).hits

    def where(self, key: int) -> Tier:
        """The tier `key` would hit in now."""
        return self.tiers.where(key)

    def held(self, key: int) -> int:
        return self.tiers.held(key)

    def forget(self, request: RequestTensors) -> None:
        for key in request.user_ids.tolist():
            self.tiers.forget(key)

    def retire(self, keys) -> None:
        """Keys never to be sent again. Without a budget they are forgotten (memory stays bounded
        by the keys in use); under a budget they stay, since the server keeps them too until its
        LRU evicts them, and the budget bounds them."""
        if not self.tiers.bounded:
            for key in keys:
                self.tiers.forget(key)

    def clear(self) -> None:
        """The server lost its cache (it restarted): nothing is held any more."""
        self.tiers.clear()
