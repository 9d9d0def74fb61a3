"""HSTU attention over a paged KV cache, for a jagged batch of users: a Triton kernel and its plain twin.

Queries are the request's new tokens, history first for every user, then every candidate. Keys
and values are all in the page pool (the new history tokens' are written there before the
call), found through each user's page table. A history query at position p sees keys 0..p; a
candidate sees its user's whole history (its own key is added by the caller: candidates' keys
are never stored). Weights are SiLU(q.k) / normaliser, no softmax, so no running maximum is
needed: each key block's contribution simply adds up.

Work is cut into query blocks that never cross users. Each block is described by one row of
`QueryBlocks.table`: (user, first row, rows, position of the first row, position step, key end).
A candidate block has step 0: all its rows sit at the last history position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

BLOCK_M = 64  # query rows per block
BLOCK_N = 64  # keys per step of the kernel's loop
_USER, _ROW0, _ROWS, _POS0, _STEP, _KEY_END = range(6)


@dataclass(frozen=True)
class QueryBlocks:
    table: np.ndarray  # int32 [blocks, 6]

    @classmethod
    def plan(cls, past: np.ndarray, n_hist: np.ndarray, n_cand: np.ndarray, block_m: int = BLOCK_M) -> QueryBlocks:
        """Blocks for users with `past` cached, `n_hist` new history tokens and `n_cand` candidates."""
        rows = []
        hist_row = 0
        cand_row = int(n_hist.sum())
        for user, (p, h, c) in enumerate(zip(past.tolist(), n_hist.tolist(), n_cand.tolist())):
            for first in range(0, h, block_m):
                rows.append((user, hist_row + first, min(block_m, h - first), p + first, 1, p + h))
            for first in range(0, c, block_m):
                rows.append((user, cand_row + first, min(block_m, c - first), p + h - 1, 0, p + h))
            hist_row += h
            cand_row += c
        # longest blocks first, so the GPU's last wave is made of short ones
        table = np.array(rows, dtype=np.int32).reshape(-1, 6)
        work = np.minimum(table[:, _POS0] + table[:, _STEP] * (table[:, _ROWS] - 1) + 1, table[:, _KEY_END])
        return cls(np.ascontiguousarray(table[np.argsort(-work, kind="stable")]))


def paged_attention(q: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor, blocks: Tensor,
                    page_tokens: int, normaliser: float) -> Tensor:
    """q [T, H, D] (any strides, last contiguous); pool_k/v [slots, H, D]; page_table int32 [B, pages];
    blocks int32 [n, 6] on q's device. Returns [T, H, D] in q's dtype (rows no block covers: zeros)."""
    if q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return _triton_attention(q, pool_k, pool_v, page_table, blocks, page_tokens, normaliser)
    return reference_attention(q, pool_k, pool_v, page_table, blocks, page_tokens, normaliser)


def reference_attention(q: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor, blocks: Tensor,
                        page_tokens: int, normaliser: float) -> Tensor:
    """The same computation in plain PyTorch, one block at a time (CPU serving and the kernel's check)."""
    out = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    for user, row0, rows, pos0, step, key_end in blocks.tolist():
        key_pos = torch.arange(key_end, device=q.device)
        slots = page_table[user].long()[key_pos // page_tokens] * page_tokens + key_pos % page_tokens
        k, v = pool_k[slots].transpose(0, 1), pool_v[slots].transpose(0, 1)  # [H, keys, D]
        query = q[row0:row0 + rows].transpose(0, 1)  # [H, rows, D]
        query_pos = pos0 + step * torch.arange(rows, device=q.device)
        weights = F.silu(query @ k.transpose(1, 2)).masked_fill(key_pos[None, :] > query_pos[:, None], 0.0)
        out[row0:row0 + rows] = ((weights @ v) / normaliser).transpose(0, 1)
    return out


_kernel = None


def _triton_attention(q, pool_k, pool_v, page_table, blocks, page_tokens, normaliser):
    global _kernel
    if _kernel is None:
        _kernel = _define_kernel()
    tokens, heads, head_dim = q.shape
    out = torch.zeros((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    if blocks.shape[0] == 0:
        return out
    _kernel[(blocks.shape[0], heads)](
        q, pool_k, pool_v, out, blocks, page_table,
        q.stride(0), q.stride(1), pool_k.stride(0), pool_k.stride(1), out.stride(0), out.stride(1),
        page_table.stride(0), 1.0 / normaliser,
        PAGE=page_tokens, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=head_dim,
        num_warps=4 if head_dim <= 64 else 8, num_stages=2,
    )
    return out


def _define_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def hstu_paged_attention(Q, K, V, OUT, BLOCKS, PAGE_TABLE,
                             stride_qt, stride_qh, stride_kt, stride_kh, stride_ot, stride_oh,
                             stride_page_table, scale,
                             PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
        block = BLOCKS + tl.program_id(0) * 6
        head = tl.program_id(1)
        user = tl.load(block)
        row0 = tl.load(block + 1)
        rows = tl.load(block + 2)
        pos0 = tl.load(block + 3)
        step = tl.load(block + 4)
        key_end = tl.minimum(tl.load(block + 5), pos0 + step * (rows - 1) + 1)
        m = tl.arange(0, BLOCK_M)
        d = tl.arange(0, HEAD_DIM)
        n = tl.arange(0, BLOCK_N)
        row_ok = m < rows
        q = tl.load(Q + (row0 + m).to(tl.int64)[:, None] * stride_qt + head * stride_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        query_pos = pos0 + step * m
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        pages = PAGE_TABLE + user.to(tl.int64) * stride_page_table
        for start in range(0, key_end, BLOCK_N):
            key_pos = start + n
            key_ok = key_pos < key_end
            page = tl.load(pages + key_pos // PAGE, mask=key_ok, other=0)
            slot = page.to(tl.int64) * PAGE + key_pos % PAGE
            offsets = slot[:, None] * stride_kt + head * stride_kh + d[None, :]
            k = tl.load(K + offsets, mask=key_ok[:, None], other=0.0)
            v = tl.load(V + offsets, mask=key_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k))
            w = s * tl.sigmoid(s)
            w = tl.where(key_pos[None, :] <= query_pos[:, None], w, 0.0)
            acc += tl.dot(w.to(v.dtype), v)
        acc = acc * scale
        tl.store(OUT + (row0 + m).to(tl.int64)[:, None] * stride_ot + head * stride_oh + d[None, :],
                 acc.to(OUT.dtype.element_ty), mask=row_ok[:, None])

    return hstu_paged_attention
