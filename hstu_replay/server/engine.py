"""Serve one request of the KV-cache interface: validate, reuse cached prefixes, compute the rest.

The engine does not care whether `compute` is the eager model (`model.EagerCompute`) or a loaded
AOTInductor package (`aoti.load_package`): both take one user's new history ids, candidate ids
and cached K/V, and return logits plus the new history tokens' K/V. Users are computed one after
another; one request is served at a time (a lock), as by the published server's single instance.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from hstu_replay.errors import InputError, LimitError
from hstu_replay.interface import NUM_CONTEXT_TOKENS, history_tokens
from hstu_replay.request import RequestTensors, UserRequest
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.kvcache import KVCache, Reuse
from hstu_replay.server.model import Compute, torch_dtype


@dataclass(frozen=True)
class InferResult:
    logits: np.ndarray  # float32 [sum(num_candidates), 8], candidates in batch order
    cached_tokens: np.ndarray  # int64 [B]: history tokens reused from the cache
    computed_tokens: np.ndarray  # int64 [B]: history tokens computed (candidates not counted)
    host_cached_tokens: np.ndarray  # int64 [B]: the part of cached_tokens onboarded from the host tier


def history_ids(user: UserRequest) -> np.ndarray:
    """The raw ids of a user's history tokens: 6 contextual, then item/action interleaved."""
    ids = np.empty(history_tokens(user.history_length), dtype=np.int64)
    ids[0] = user.user_id
    ids[1:NUM_CONTEXT_TOKENS] = user.context
    ids[NUM_CONTEXT_TOKENS::2] = user.history_items
    ids[NUM_CONTEXT_TOKENS + 1 :: 2] = user.history_actions
    return ids


def check_fits(cfg: ModelConfig, users: list[UserRequest], tensors: RequestTensors) -> None:
    """Refuse a request the model was not exported for (the packages would clamp, not fail)."""
    if len(users) > cfg.max_batch:
        raise LimitError(f"batch of {len(users)} users; the model takes at most {cfg.max_batch}")
    if len(tensors.user_ids) != len(users) or len(tensors.total_history_lengths) != len(users):
        raise InputError(f"user_ids and total_history_lengths must have one entry per user ({len(users)})")
    for u, total in zip(users, tensors.total_history_lengths):
        if u.total_history_length != total:
            raise InputError(f"user {u.user_id}: total_history_length {int(total)} but the layout implies "
                             f"{u.total_history_length}")
        if u.history_length > cfg.max_history:
            raise LimitError(f"user {u.user_id}: history of {u.history_length} items exceeds {cfg.max_history}")
        if len(u.candidates) > cfg.max_candidates:
            raise LimitError(f"user {u.user_id}: {len(u.candidates)} candidates exceed {cfg.max_candidates}")


class RankingEngine:
    def __init__(self, config: ModelConfig, compute: Compute, cache: KVCache | None, device: str = "cpu") -> None:
        self.config = config
        self.compute = compute
        self.cache = cache
        self.device = torch.device(device)
        self._lock = threading.Lock()
        shape = (config.num_layers, 0, config.num_heads, config.head_dim)
        self._empty = torch.zeros(shape, dtype=torch_dtype(config), device=self.device)

    def infer(self, tensors: RequestTensors) -> InferResult:
        users = tensors.users()
        check_fits(self.config, users, tensors)
        totals = [int(t) for t in tensors.total_history_lengths]
        with self._lock:
            if self.cache is not None:
                self.cache.check_request([u.key for u in users], totals)
            return self._serve(users, totals)

    def clear_cache(self) -> None:
        if self.cache is not None:
            with self._lock:
                self.cache.clear()

    def _serve(self, users: list[UserRequest], totals: list[int]) -> InferResult:
        if self.cache is not None:
            reuse_plan = self.cache.begin([u.key for u in users], totals)
        else:
            reuse_plan = [Reuse(0, None, 0)] * len(users)
        try:
            return self._compute(users, totals, reuse_plan)
        except Exception:
            if self.cache is not None:  # the ledger already counts these users as held: undo
                for user in users:
                    self.cache.forget(user.key)
            raise

    def _compute(self, users: list[UserRequest], totals: list[int], reuse_plan: list[Reuse]) -> InferResult:
        logits, cached, computed, stored = [], [], [], []
        for user, total, plan in zip(users, totals, reuse_plan):
            reuse, entry = plan.hit, plan.entry
            past_k = self._empty if entry is None else entry.k[:, :reuse]
            past_v = self._empty if entry is None else entry.v[:, :reuse]
            ids = torch.from_numpy(history_ids(user)[reuse:]).to(self.device)
            cands = torch.from_numpy(np.ascontiguousarray(user.candidates, dtype=np.int64)).to(self.device)
            out, new_k, new_v = self.compute(ids, cands, past_k, past_v)
            if self.cache is not None:
                if new_k.shape[1] > 0:
                    past_k, past_v = torch.cat([past_k, new_k], 1), torch.cat([past_v, new_v], 1)
                self.cache.store(user.key, past_k, past_v)
                stored.append((user.key, past_k, past_v))
            logits.append(out.float().cpu().numpy())
            cached.append(reuse)
            computed.append(total - reuse)
        if self.cache is not None:
            self.cache.offload(stored)
        return InferResult(
            logits=np.concatenate(logits).astype(np.float32, copy=False).reshape(-1, 8),
            cached_tokens=np.array(cached, dtype=np.int64),
            computed_tokens=np.array(computed, dtype=np.int64),
            host_cached_tokens=np.array([r.onboarded for r in reuse_plan], dtype=np.int64),
        )


class PackagedRanker:
    """The self-contained no-cache package (the published `hstu_gr_ranking`) as an engine."""

    cache = None

    def __init__(self, config: ModelConfig, package) -> None:
        self.config = config
        self.package = package
        self._lock = threading.Lock()

    def infer(self, tensors: RequestTensors) -> InferResult:
        users = tensors.users()
        check_fits(self.config, users, tensors)
        with self._lock:
            logits = self.package(*(torch.from_numpy(np.ascontiguousarray(a)) for a in
                                    (tensors.values, tensors.lengths, tensors.num_candidates)))
        zeros = np.zeros(tensors.batch_size, dtype=np.int64)
        return InferResult(logits.float().cpu().numpy().reshape(-1, 8), zeros, tensors.total_history_lengths.copy(),
                           zeros)

    def clear_cache(self) -> None:
        pass
