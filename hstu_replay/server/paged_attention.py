"""HSTU attention over a paged KV cache, for a jagged batch of users: a Triton kernel and its plain twin.

Queries are the request's new tokens, history first for every user, then every candidate. Keys
and values are all in the page pool (the new history tokens' are written there before the
call), found through each user's page table. A history query at position p sees keys 0..p; a
candidate sees its user's whole history and itself (its own key and value come from `k`/`v`,
the new keys of the request's last rows: candidates' keys are never stored). The new tokens'
`q`, `k` and `v` arrive as the layer's projection made them, before its SiLU, which the attention
applies as it reads them (so that a compiled step need not lay them out activated first); the
pool holds keys and values after it. Weights are
SiLU(q.k) / normaliser, no softmax, so no running maximum is needed: each key's contribution
simply adds up, and one query block's keys can be split over several programs whose partial sums
are added atomically (split-K). That is what keeps a GPU busy when a fully cached request has only
a few candidate blocks, each facing thousands of keys.

Work items never cross users. Each is one row of `WorkPlan.items`: (user, first row, rows,
position of the first row, position step, first key, key end). A candidate block has step 0:
all its rows sit at the last history position. A plan whose keys are split cuts its blocks
smaller (`CHUNK_BLOCK_M` rows), and its chunks run in a launch of their own tiles: a long, thin
chunk of a few candidates against a thousand keys is bound by memory and latency, where a block
of history is bound by the tensor cores (on the H200 a fully cached batch of 8 took 0.11 ms a
layer in 64-row tiles against 0.17 in 128-row ones; a cold one 1.30 ms in 128-row tiles against
1.66 in 64-row ones, `bench/gpu_attention_tune.py`, call 25).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

BLOCK_M = 128  # query rows per work item
#: query rows per work item in a plan whose keys are split; cpp/backend/work_plan.h's kChunkBlockM
CHUNK_BLOCK_M = 64
BLOCK_N = 64  # keys per step of the kernel's loop
#: Split keys when the query blocks alone would give fewer programs than this (2 per SM of an H100/H200:
#: on the H200 a fully cached batch of 8 protocol users took 0.094 ms against 0.124 with 512 and 0.105
#: with 132, bench/gpu_attention_tune.py). cpp/backend/work_plan.h's kMinPrograms is the same number.
MIN_PROGRAMS = 264
#: How the kernel computes SiLU on a GPU (its FAST_SILU): the sigmoid (exact; what the interpreter
#: runs), one hardware tanh in 32 bits, or one hardware tanh for two 16-bit values (sm_90 on, bf16 only)
SILU_SIGMOID, SILU_TANH, SILU_TANH_BF16X2 = 0, 1, 2
#: Which items one launch of the kernel runs (its RUNS): all (a plan not split), the whole items alone,
#: or the chunks of splits alone (a split plan's two launches, each on its own tiles)
ALL_ITEMS, WHOLE_ITEMS, CHUNKS = 0, 1, 2
_USER, _ROW0, _ROWS, _POS0, _STEP, _KEY0, _KEY_END = range(7)


@dataclass(frozen=True)
class WorkPlan:
    items: np.ndarray  # int32 [n, 7]
    split: bool  # several items may share query rows: their sums are added atomically
    #: the most items a plan of the same blocks can have, whatever its users' lengths: split chunks
    #: are at least total keys x heads / min_programs long, so they add at most min_programs / heads
    capacity: int = 0

    @classmethod
    def plan(cls, past: np.ndarray, n_hist: np.ndarray, n_cand: np.ndarray, heads: int,
             block_m: int = BLOCK_M, min_programs: int = MIN_PROGRAMS, block_n: int = BLOCK_N,
             chunk_block_m: int = CHUNK_BLOCK_M) -> WorkPlan:
        """Items for users with `past` cached, `n_hist` new history tokens and `n_cand` candidates:
        blocks of `block_m` rows, or of `chunk_block_m` rows with their keys split when `block_m`'s
        would give fewer than `min_programs` programs."""
        past, n_hist, n_cand = (np.asarray(a, dtype=np.int64) for a in (past, n_hist, n_cand))
        items = _blocks(past, n_hist, n_cand, block_m)
        split = 0 < len(items) * heads < min_programs
        if split:
            items = _blocks(past, n_hist, n_cand, chunk_block_m)
        capacity = len(items) + (min_programs // heads if split else 0)
        if split:
            items = _split_keys(items, heads, min_programs, block_n)
        # longest first, so the GPU's last wave is made of short ones
        work = items[:, _KEY_END] - items[:, _KEY0]
        return cls(np.ascontiguousarray(items[np.argsort(-work, kind="stable")], dtype=np.int32), split, capacity)


def _blocks(past: np.ndarray, n_hist: np.ndarray, n_cand: np.ndarray, block_m: int) -> np.ndarray:
    """One item per block of `block_m` query rows: every user's history blocks, then its candidate blocks."""
    kv_len = past + n_hist
    hist_blocks = -(-n_hist // block_m)
    cand_blocks = -(-n_cand // block_m)
    # history blocks, all users, then candidate blocks: (user, index of the block in its part)
    hist_user = np.repeat(np.arange(len(past)), hist_blocks)
    hist_first = _index_in_group(hist_blocks) * block_m
    cand_user = np.repeat(np.arange(len(past)), cand_blocks)
    cand_first = _index_in_group(cand_blocks) * block_m
    hist_row0 = np.cumsum(n_hist) - n_hist
    cand_row0 = n_hist.sum() + np.cumsum(n_cand) - n_cand
    items = np.concatenate([
        np.stack([hist_user, hist_row0[hist_user] + hist_first,
                  np.minimum(block_m, n_hist[hist_user] - hist_first), past[hist_user] + hist_first,
                  np.ones_like(hist_user), np.zeros_like(hist_user), kv_len[hist_user]], axis=1),
        np.stack([cand_user, cand_row0[cand_user] + cand_first,
                  np.minimum(block_m, n_cand[cand_user] - cand_first), kv_len[cand_user] - 1,
                  np.zeros_like(cand_user), np.zeros_like(cand_user), kv_len[cand_user]], axis=1),
    ]).reshape(-1, 7)
    # keys a block really visits: up to its last row's position
    items[:, _KEY_END] = np.minimum(items[:, _KEY_END], items[:, _POS0] + items[:, _STEP] * (items[:, _ROWS] - 1) + 1)
    return items


def _split_keys(items: np.ndarray, heads: int, min_programs: int, block_n: int) -> np.ndarray:
    """Cut each item's keys into chunks (multiples of the kernel's `block_n`) so that about `min_programs`
    programs run."""
    total_keys = int(items[:, _KEY_END].sum())
    chunk = max(4 * block_n, -(-total_keys * heads // min_programs))
    chunk = -(-chunk // block_n) * block_n
    pieces = np.maximum(1, -(-items[:, _KEY_END] // chunk))
    out = np.repeat(items, pieces, axis=0)
    out[:, _KEY0] = _index_in_group(pieces) * chunk
    out[:, _KEY_END] = np.minimum(out[:, _KEY_END], out[:, _KEY0] + chunk)
    return out


def _index_in_group(counts: np.ndarray) -> np.ndarray:
    """For groups of `counts` elements laid end to end: each element's index inside its group."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


class AttentionKernels(NamedTuple):
    """`attention_kernel`'s three kernels, as launched (plain, or wrapped for a `triton_op`)."""

    attend: Callable
    zero: Callable
    finish: Callable

    @classmethod
    def of(cls, wrap: Callable = lambda kernel: kernel) -> AttentionKernels:
        from hstu_replay.server import attention_kernel as kernel  # needs triton

        return cls(*(wrap(k) for k in (kernel.hstu_paged_attention, kernel.split_rows_zero, kernel.split_rows_finish)))


@dataclass(frozen=True)
class KernelLaunch:
    """How the Triton kernel is launched: its tiles (the plans must be cut to the same: `WorkPlan.plan`'s
    block_m, block_n and chunk_block_m) and its pipeline, for whole items and for the chunks of a
    split. `LAUNCH` is the one every engine and package uses."""

    block_m: int = BLOCK_M
    block_n: int = BLOCK_N
    # 4 warps: on the H200 a cold batch of 8 protocol users took 1.19 ms against 8 warps' 1.73 (483
    # against 331 TFLOP/s), fully cached 0.102 against 0.124 ms (bench/gpu_attention_tune.py)
    num_warps: int = 4
    num_stages: int = 3  # on a GPU in 16 bits; 1 otherwise
    silu: int = SILU_TANH  # SILU_*; the interpreter always takes the sigmoid
    chunk_block_m: int = CHUNK_BLOCK_M
    chunk_warps: int = 4
    chunk_stages: int = 3

    @classmethod
    def uniform(cls, block_m: int, block_n: int, num_warps: int, num_stages: int,
                silu: int = SILU_TANH) -> KernelLaunch:
        """The same tiles and pipeline for whole items and chunks."""
        return cls(block_m, block_n, num_warps, num_stages, silu, block_m, num_warps, num_stages)

    def __call__(self, kernels: AttentionKernels, q: Tensor, k: Tensor, v: Tensor, pool_k: Tensor, pool_v: Tensor,
                 items: Tensor, page_table: Tensor, page_tokens: int, normaliser: float, split: bool) -> Tensor:
        """The attention in q's dtype. `split`: the split mode (items may share rows; right for every
        plan): whole items and the chunks of splits run in a launch each, on their own tiles; the
        chunks add up in a float32 buffer whose rows are zeroed before and written out after, in two
        more launches that touch those rows alone."""
        heads, head_dim = q.shape[1:]
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        acc = torch.empty(q.shape, dtype=torch.float32, device=q.device) if split else out
        grid = (items.shape[0], heads)
        chunk_rows = dict(BLOCK_M=self.chunk_block_m, HEAD_DIM=head_dim)
        pipelined = q.is_cuda and q.element_size() == 2

        def attend(runs: int, block_m: int, num_warps: int, num_stages: int) -> None:
            kernels.attend[grid](
                q, k, v, pool_k, pool_v, out, acc, items, page_table,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), pool_k.stride(0), pool_k.stride(1), out.stride(0),
                out.stride(1), acc.stride(0), acc.stride(1), page_table.stride(0), 1.0 / normaliser,
                q.shape[0] - k.shape[0], PAGE=page_tokens, BLOCK_M=block_m, BLOCK_N=self.block_n, HEAD_DIM=head_dim,
                SPLIT=split, RUNS=runs, FAST_SILU=self._silu(q), num_warps=num_warps,
                num_stages=num_stages if pipelined else 1)

        if not split:
            attend(ALL_ITEMS, self.block_m, self.num_warps, self.num_stages)
            return out
        kernels.zero[grid](acc, items, acc.stride(0), acc.stride(1), **chunk_rows)
        attend(WHOLE_ITEMS, self.block_m, self.num_warps, self.num_stages)
        attend(CHUNKS, self.chunk_block_m, self.chunk_warps, self.chunk_stages)
        kernels.finish[grid](acc, out, items, acc.stride(0), acc.stride(1), out.stride(0), out.stride(1), **chunk_rows)
        return out

    def _silu(self, q: Tensor) -> int:
        if not q.is_cuda:
            return SILU_SIGMOID
        return self.silu if q.dtype == torch.bfloat16 else min(self.silu, SILU_TANH)


LAUNCH = KernelLaunch()


def paged_attention(q: Tensor, k: Tensor, v: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor,
                    split: bool, items: Tensor, page_tokens: int, normaliser: float,
                    launch: KernelLaunch | None = None) -> Tensor:
    """q [T, H, D] the new tokens' queries; k, v [C, H, D] the new keys and values of q's last C rows,
    C at least the candidates' (only a candidate's own key is read from them: history keys come from
    the pool); all three before the SiLU (applied here), any strides, last contiguous, k and v's the
    same; pool_k/v [slots, H, D] after it;
    page_table int [B, pages]; `items` a `WorkPlan`'s items (any int type; items of no rows do nothing) on
    q's device and `split` its flag; `launch` the kernel's (default `LAUNCH`; the plan cut to its tiles:
    whole items of at most its block_m rows, chunks of at most its chunk_block_m).
    Returns [T, H, D] in q's dtype."""
    if q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return _triton_attention(q, k, v, pool_k, pool_v, page_table, split, items, page_tokens, normaliser,
                                 launch or LAUNCH)
    return reference_attention(q, k, v, pool_k, pool_v, page_table, items, page_tokens, normaliser)


def reference_attention(q: Tensor, k_new: Tensor, v_new: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor,
                        items: Tensor, page_tokens: int, normaliser: float) -> Tensor:
    """The same computation in plain PyTorch, one item at a time (CPU serving and the kernel's check)."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    new_row0 = q.shape[0] - k_new.shape[0]  # k_new/v_new: the last rows' (see paged_attention)
    q = F.silu(q)  # every row is a query; of k_new and v_new only the candidates' own rows are read
    for user, row0, rows, pos0, step, key0, key_end in items.tolist():
        if step == 0 and key0 == 0:  # candidates see themselves (added once: by their first key chunk)
            own_rows = slice(row0 - new_row0, row0 - new_row0 + rows)
            own = F.silu((q[row0:row0 + rows].float() * F.silu(k_new[own_rows]).float()).sum(-1, keepdim=True))
            out[row0:row0 + rows] += own * F.silu(v_new[own_rows]).float()
        key_pos = torch.arange(key0, key_end, device=q.device)
        slots = page_table[user].long()[key_pos // page_tokens] * page_tokens + key_pos % page_tokens
        k, v = pool_k[slots].transpose(0, 1), pool_v[slots].transpose(0, 1)  # [H, keys, D]
        query = q[row0:row0 + rows].transpose(0, 1)  # [H, rows, D]
        query_pos = pos0 + step * torch.arange(rows, device=q.device)
        weights = F.silu(query @ k.transpose(1, 2)).masked_fill(key_pos[None, :] > query_pos[:, None], 0.0)
        out[row0:row0 + rows] += (weights @ v).transpose(0, 1).float()
    return (out / normaliser).to(q.dtype)



def _triton_attention(q, k, v, pool_k, pool_v, page_table, split, items, page_tokens, normaliser, launch):
    if not items.shape[0]:
        return torch.zeros_like(q, memory_format=torch.contiguous_format)
    return launch(AttentionKernels.of(), q, k, v, pool_k, pool_v, items, page_table, page_tokens, normaliser, split)
