"""The client's model of the server's KV cache: the hits each request should find, predicted
before it is sent (NVIDIA's semantics, through `CacheLedger`), and keys whose server state is
unknown after a failure forgotten."""

from __future__ import annotations

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.request import RequestTensors


class CacheModel:
    def __init__(self, budget_tokens: int | None, page_tokens: int):
        self.ledger = CacheLedger(budget_tokens, page_tokens)

    def predict(self, request: RequestTensors) -> tuple[int, ...]:
        pairs = zip(request.user_ids.tolist(), request.total_history_lengths.tolist())
        return self.ledger.serve(list(pairs)).hits

    def forget(self, request: RequestTensors) -> None:
        for key in request.user_ids.tolist():
            self.ledger.forget(key)

    def retire(self, keys) -> None:
        """Keys never to be sent again. Without a budget they are forgotten (memory stays bounded
        by the keys in use); under a budget they stay, since the server keeps them too until its
        LRU evicts them, and the budget bounds them."""
        if self.ledger.budget_pages is None:
            for key in keys:
                self.ledger.forget(key)

    def clear(self) -> None:
        """The server lost its cache (it restarted): nothing is held any more."""
        self.ledger.clear()
