"""The batched engine's forward pass as a module: one jagged batch of new tokens against a page pool.

Inputs are device tensors: the new tokens' ids, kinds and positions (every user's new history
tokens, then every candidate), the page table, the attention work items (`WorkPlan.items`) and
the pool slots the new history tokens' keys and values go to (as many as there are history
tokens; none for a fully cached request). The pools [layers, slots, heads, head dim] are written
in place. Returns the candidates' logits, float32.

The eager engine runs it with `paged_attention` (the Triton kernel on a GPU); `aoti` exports it
with an attention operator (`attention_ops`), so that an AOTInductor package holds the whole step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hstu_replay.server.model import HSTUModel
from hstu_replay.server.paged_attention import paged_attention


def _by_head(t: Tensor, cfg) -> Tensor:
    """[tokens, heads x head dim] as [tokens, heads, head dim] (a view)."""
    return t.unflatten(-1, (cfg.num_heads, cfg.head_dim))


class BatchedStep(nn.Module):
    def __init__(self, model: HSTUModel, page_tokens: int, attention=None) -> None:
        """`attention(q, k, v, pool_k, pool_v, page_table, items)` (q, k, v: every new token's, before
        the SiLU, as `paged_attention` takes them); default: `paged_attention` with the plan's split flag."""
        super().__init__()
        self.model, self.page_tokens, self.attention = model, page_tokens, attention

    def forward(self, ids: Tensor, kinds: Tensor, positions: Tensor, page_table: Tensor, items: Tensor, slots: Tensor,
                pool_k: Tensor, pool_v: Tensor, split: bool = True) -> Tensor:
        model, cfg = self.model, self.model.config
        n_hist = slots.shape[0]
        # every slot is a new history token's: with this known, the rows written below are exactly
        # n_hist long (`narrow`), where a slice would be min(n_hist, tokens), a size Inductor's CUDA
        # lowering of index_put_ cannot broadcast against the slots' (ExpandView([u0, ...], [s, ...]))
        torch._check(n_hist <= ids.shape[0])
        x = model.embed(ids, kinds, positions)
        for index, layer in enumerate(model.layers):
            projected = layer.uvqk(layer.norm_in(x))
            u, v, _, k = F.silu(projected).split(cfg.attn_dim, dim=-1)  # q: activated by the attention
            # contiguous: Inductor cannot slice the strided view `split` leaves (a lowering error on a GPU)
            k, v = (_by_head(t, cfg).contiguous() for t in (k, v))
            at_layer = slots.new_full((1,), index)
            pool_k.index_put_((at_layer, slots), k.narrow(0, 0, n_hist))
            pool_v.index_put_((at_layer, slots), v.narrow(0, 0, n_hist))
            # attention takes the new tokens' q, k and v from the projection as it is, and applies the
            # SiLU as it reads them: none of them is laid out for it (of k and v it reads the
            # candidates' own rows alone; the history's are in the pool)
            _, v_new, q_new, k_new = (_by_head(t, cfg) for t in projected.split(cfg.attn_dim, dim=-1))
            if self.attention is None:
                attn = paged_attention(q_new, k_new, v_new, pool_k[index], pool_v[index], page_table, split, items,
                                       self.page_tokens, cfg.attn_normaliser)
            else:
                attn = self.attention(q_new, k_new, v_new, pool_k[index], pool_v[index], page_table, items)
            x = x + layer.out(layer.norm_attn(attn.flatten(1)) * u)
        return model.head(x[n_hist:]).float()
