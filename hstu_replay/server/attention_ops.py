"""Paged attention as torch operators, so that an exported forward pass can carry it.

`hstu_replay::paged_attention` is the plain twin (`paged_attention.reference_attention`) behind
an opaque operator: a package compiled for a CPU calls back into this process for it (the operator
must be registered, which importing this module does). `hstu_replay::paged_attention_triton` is the
Triton kernel as a `triton_op`: AOTInductor compiles the kernel into a GPU package, which then needs
no Python to run it. `exportable` picks one by device. Both are right for every `WorkPlan`, split
or not, so one package serves them all: the kernel runs in its split mode, where an item that is
the only one of its rows writes them and only the chunks of a split add atomically (in a float32
buffer whose rows of splits alone are zeroed before and written out after).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from hstu_replay.server.paged_attention import LAUNCH, AttentionKernels, reference_attention

Attention = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


@torch.library.custom_op("hstu_replay::paged_attention", mutates_args=())
def _plain_op(q: Tensor, k: Tensor, v: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor, items: Tensor,
              page_tokens: int, normaliser: float) -> Tensor:
    return reference_attention(q, k, v, pool_k, pool_v, page_table, items, page_tokens, normaliser)


@_plain_op.register_fake
def _(q, k, v, pool_k, pool_v, page_table, items, page_tokens, normaliser):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@functools.cache
def _triton_op():
    from torch.library import triton_op, wrap_triton

    kernels = AttentionKernels.of(wrap_triton)

    @triton_op("hstu_replay::paged_attention_triton", mutates_args=())
    def op(q: Tensor, k: Tensor, v: Tensor, pool_k: Tensor, pool_v: Tensor, page_table: Tensor, items: Tensor,
           page_tokens: int, normaliser: float) -> Tensor:
        return LAUNCH(kernels, q, k, v, pool_k, pool_v, items, page_table, page_tokens, normaliser, True)

    return op


def exportable(device: torch.device, page_tokens: int, normaliser: float) -> Attention:
    """The attention an exported step calls on `device`: the kernel on a GPU, the plain twin elsewhere."""
    op = _triton_op() if device.type == "cuda" else _plain_op

    def attention(q, k, v, pool_k, pool_v, page_table, items):
        return op(q, k, v, pool_k, pool_v, page_table, items, page_tokens, normaliser)

    return attention
