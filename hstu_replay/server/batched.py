"""The fast engine: every user of a request in one forward pass, K/V read and written in place in a page pool.

Same model, same weights and same answers as the per-user engine (`engine.RankingEngine`), laid
out for a GPU: the request's new tokens form one jagged batch (all users' new history tokens,
then all candidates), so each linear layer is one matrix product for the whole request; each
layer writes its new history keys/values straight into the user's cache pages and attention
reads them back through the page table (`paged_attention`). A fully cached request computes
only its candidates and copies nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from hstu_replay.cache_ledger import pages
from hstu_replay.request import RequestTensors, UserRequest
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.engine import InferResult, check_fits, history_ids
from hstu_replay.server.host_tier import KVLayout
from hstu_replay.server.model import ITEM_KIND, HSTUModel, history_kinds
from hstu_replay.server.batched_step import BatchedStep
from hstu_replay.server.paged_attention import WorkPlan
from hstu_replay.server.phases import NO_CLOCK
from hstu_replay.server.paged_cache import PagedKVCache, UserPages
from hstu_replay.server.serve_config import HostTierOptions
from hstu_replay.server.step_graphs import (StepGraphs, StepInputs, StepShape, graphs_enabled, pack_parts,
                                             unpack_parts)


class BatchedEngine:
    def __init__(self, model: HSTUModel, cache: PagedKVCache, forward_step: Callable[..., Tensor] | None = None) -> None:
        """`forward_step`: the forward pass with `BatchedStep`'s signature (default: `BatchedStep` itself,
        eager; an AOTInductor package of it serves the same way)."""
        self.config: ModelConfig = model.config
        self.model = model
        self.cache = cache
        self.forward_step = forward_step or BatchedStep(model, cache.page_tokens)
        self.device = cache.pool_k.device
        self._lock = threading.Lock()
        self.table_pages = pages(self.config.max_history_tokens, cache.page_tokens)  # a full user's pages
        self.graphs = StepGraphs(self.step, self.device) if graphs_enabled(self.device) else None
        self.clock = NO_CLOCK  # a served model's `PhaseClock` times the forward pass's parts

    def infer(self, tensors: RequestTensors) -> InferResult:
        users = tensors.users()
        check_fits(self.config, users, tensors)
        keys = [u.key for u in users]
        totals = [int(t) for t in tensors.total_history_lengths]
        with self._lock:
            with self.clock.phase("engine.cache"):
                self.cache.check_request(keys, totals)
                placed = self.cache.begin(keys, totals)
            try:
                logits = self._forward(users, placed)
                with self.clock.phase("engine.offload"):
                    self.cache.offload(placed)
            except Exception:
                for key in keys:  # the ledger already counts these users as held: undo
                    self.cache.forget(key)
                raise
            finally:
                self.cache.finish(keys)
        hits = np.array([p.hit for p in placed], dtype=np.int64)
        onboarded = np.array([p.onboarded for p in placed], dtype=np.int64)
        return InferResult(logits, hits, np.array(totals, dtype=np.int64) - hits, onboarded)

    def clear_cache(self) -> None:
        with self._lock:
            self.cache.clear()

    def _forward(self, users: list[UserRequest], placed: list[UserPages]) -> np.ndarray:
        cfg, cache = self.config, self.cache
        with self.clock.phase("engine.plan"):
            page = cache.page_tokens
            hit = np.array([p.hit for p in placed], dtype=np.int64)
            total = np.array([p.total for p in placed], dtype=np.int64)
            n_hist, n_cand = total - hit, np.array([len(u.candidates) for u in users], dtype=np.int64)
            hist_pos = np.concatenate([np.arange(p.hit, p.total) for p in placed])
            page_table = cache.page_table(placed)
            positions = np.concatenate([hist_pos, np.repeat(total, n_cand)])
            plan = WorkPlan.plan(hit, n_hist, n_cand, cfg.num_heads)
            candidates = [np.asarray(u.candidates, dtype=np.int64) for u in users]
        if self.graphs is not None and not len(hist_pos):  # fully cached: one graph launch
            shape = StepShape.of(int(n_cand.sum()), plan.capacity, cfg.max_batch, self.table_pages, plan.split)
            try:
                with self.clock.phase("engine.graph"):
                    logits = self.graphs.run(shape, np.concatenate(candidates), positions, page_table, plan.items,
                                             cache.generation)
                return logits.reshape(-1, 8)
            except RuntimeError as exc:  # a capture the device refused: every step runs eagerly from now on
                print(f"hstu-replay: CUDA graphs off: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
                self.graphs = None
        with self.clock.phase("engine.eager"):
            owner = np.repeat(np.arange(len(users)), n_hist)
            slots = page_table[owner, hist_pos // page] * page + hist_pos % page
            ids = [history_ids(u)[p.hit:] for u, p in zip(users, placed) if p.hit < p.total] + candidates
            kinds = np.concatenate([history_kinds(torch.from_numpy(hist_pos)).numpy(),
                                    np.full(int(n_cand.sum()), ITEM_KIND, dtype=np.int64)])
            # one host-to-device copy for every index the forward needs
            parts = [np.concatenate(ids), kinds, positions, page_table.ravel(), plan.items.ravel(), slots]
            packed = torch.from_numpy(pack_parts(parts)).to(self.device, non_blocking=True)
            ids_t, kinds_t, pos_t, table_t, items_t, slots_t = unpack_parts(packed, [len(part) for part in parts])
            inputs = StepInputs(ids_t, kinds_t, pos_t, table_t.view(page_table.shape), items_t.view(plan.items.shape))
            return self.step(inputs, plan.split, slots_t).cpu().numpy().reshape(-1, 8)

    def step(self, inputs: StepInputs, split: bool, slots: Tensor | None = None) -> Tensor:
        """The forward pass on device tensors: the new history tokens (written to the pool at `slots`)
        first, then the candidates; returns the candidates' logits (float32, on the device)."""
        if slots is None:
            slots = inputs.ids.new_empty(0)
        with torch.inference_mode():
            return self.forward_step(inputs.ids, inputs.kinds, inputs.positions, inputs.page_table, inputs.items, slots,
                                     self.cache.pool_k, self.cache.pool_v, split)


def build_batched_engine(model: HSTUModel, budget_tokens: int, page_tokens: int,
                         host: HostTierOptions | None = None,
                         forward_step: Callable[..., Tensor] | None = None, reserve: bool = False) -> BatchedEngine:
    """An engine over `model` (already on its device) with a pool for `budget_tokens` cached tokens
    (taken whole at start with `reserve`) and, given `host`, a host tier behind it; `forward_step` as
    for `BatchedEngine`."""
    weight = model.embed.table.weight
    layout = KVLayout(model.config.num_layers, model.config.num_heads, model.config.head_dim, weight.dtype)
    tier = (host or HostTierOptions()).build(page_tokens, layout, weight.device)
    cache = PagedKVCache(model.config, budget_tokens, page_tokens, weight.device, weight.dtype, tier, reserve)
    return BatchedEngine(model, cache, forward_step)
