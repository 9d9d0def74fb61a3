"""HSTU ranking in plain PyTorch, written so one forward serves cold, partly and fully cached users.

A user's sequence is [6 contextual tokens, item_0, action_0, ..., item_{h-1}, action_{h-1},
cand_0, ..., cand_{c-1}]. History tokens attend causally; each candidate attends to every history
token and to itself. Because of that mask, a history token's keys and values at every layer depend
only on the prefix before it: they are what the KV cache keeps. Attention weights are divided by a
constant, so a query's output is the same whatever part of its keys came from the cache.

`HSTUModel.forward` is the core: a batch of users, each with `past_len` cached tokens (keys and
values given), `hist_len` new history tokens and some candidates, all padded to common sizes and
masked. Padded rows never reach a real token, so results are exact whatever the padding.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hstu_replay.interface import NUM_CONTEXT_TOKENS, NUM_TASKS, history_tokens
from hstu_replay.server.model_config import ModelConfig

ITEM_KIND = NUM_CONTEXT_TOKENS  # token kinds: 0 user id, 1..5 context, 6 item, 7 action
ACTION_KIND = NUM_CONTEXT_TOKENS + 1
_HIDDEN = 1 << 40  # key position no query reaches: pads and candidates (for other queries)
#: Every dynamic size of the exported step is padded to at least this, so torch.export never
#: specialises a size to 0 or 1 (a cold user has no cached token; a fully cached one no new one).
MIN_SIZE = 2
#: Gains on PyTorch's default initialisation of each layer's query and key projections and of its
#: output projection, so that a model of random weights answers from its user's history, not from
#: the candidate alone. Without them, another user's history of the same length moved kuairand-1k's
#: logits by 0.02-0.04, inside NVIDIA's bf16 tolerance (0.0625): answers served from the wrong cache
#: passed the check. With them 0.10-0.29 (300 to 4,000 items), and bf16 against float32 0.005-0.007
#: (`bench/model_sensitivity.py`; docs/design.md, "Why the reference model's weights are scaled").
QK_GAIN, OUT_GAIN = 2.0, 6.0


def torch_dtype(config: ModelConfig) -> torch.dtype:
    return getattr(torch, config.dtype)


def history_kinds(positions: Tensor) -> Tensor:
    """Token kind at each history position: the 6 contextual features, then item/action alternating."""
    return torch.where(positions < NUM_CONTEXT_TOKENS, positions, ITEM_KIND + (positions - NUM_CONTEXT_TOKENS) % 2)


class TokenEmbedding(nn.Module):
    """All eight features' tables in one: row = offset[kind] + id % size[kind]; plus position."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        sizes = [config.user_table_size] + [config.context_table_size] * 5
        sizes += [config.item_table_size, config.action_table_size]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.register_buffer("sizes", torch.tensor(sizes, dtype=torch.int64), persistent=False)
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.int64), persistent=False)
        self.table = nn.Embedding(sum(sizes), config.hidden_dim)
        self.position = nn.Embedding(config.max_positions, config.hidden_dim)
        self.last_position = config.max_positions - 1

    def forward(self, ids: Tensor, kinds: Tensor, positions: Tensor) -> Tensor:
        rows = self.offsets[kinds] + torch.remainder(ids, self.sizes[kinds])  # never negative
        return self.table(rows) + self.position(positions.clamp(0, self.last_position))


class HSTULayer(nn.Module):
    """LayerNorm -> SiLU(linear) to U, V, Q, K -> masked SiLU attention -> LayerNorm * U -> linear."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.attn_dim = config.num_heads, config.head_dim, config.attn_dim
        self.normaliser = config.attn_normaliser
        self.norm_in = nn.LayerNorm(config.hidden_dim)
        self.uvqk = nn.Linear(config.hidden_dim, 4 * config.attn_dim)
        self.norm_attn = nn.LayerNorm(config.attn_dim)
        self.out = nn.Linear(config.attn_dim, config.hidden_dim)
        self.scale(QK_GAIN, OUT_GAIN)

    @torch.no_grad()
    def scale(self, qk_gain: float, out_gain: float) -> None:
        """Multiply the query and key projections' weights by `qk_gain`, the output projection's by `out_gain`."""
        self.uvqk.weight[2 * self.attn_dim:] *= qk_gain  # the rows of q and k (split as u, v, q, k)
        self.out.weight *= out_gain

    def forward(self, x: Tensor, past_k: Tensor, past_v: Tensor, blocked: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, N, hidden], past_k/v [B, P, H, D], blocked [B, N, P+N] -> (x', k [B, N, H, D], v)."""
        batch, n = x.shape[0], x.shape[1]
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).split(self.attn_dim, dim=-1)
        q, k, v = (t.reshape(batch, n, self.heads, self.head_dim) for t in (q, k, v))
        keys = torch.cat([past_k, k], dim=1).transpose(1, 2)  # [B, H, P+N, D]
        vals = torch.cat([past_v, v], dim=1).transpose(1, 2)
        scores = torch.matmul(q.transpose(1, 2), keys.transpose(2, 3))  # [B, H, N, P+N]
        # in place: the [B, H, N, P+N] scores are the largest tensor by far
        weights = F.silu(scores, inplace=True).masked_fill_(blocked[:, None], 0.0).div_(self.normaliser)
        attn = torch.matmul(weights, vals).transpose(1, 2).reshape(batch, n, self.attn_dim)
        return x + self.out(self.norm_attn(attn) * u), k, v


class HSTUModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = TokenEmbedding(config)
        self.layers = nn.ModuleList(HSTULayer(config) for _ in range(config.num_layers))
        self.head = nn.Sequential(
            nn.LayerNorm(config.hidden_dim),
            nn.Linear(config.hidden_dim, config.hidden_dim),
            nn.SiLU(),
            nn.Linear(config.hidden_dim, NUM_TASKS),
        )

    def forward(
        self, hist_ids: Tensor, hist_len: Tensor, cand_ids: Tensor,
        past_k: Tensor, past_v: Tensor, past_len: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """A padded batch of users.

        hist_ids [B, Nh] raw ids of the new history tokens (user b's first hist_len[b] are real);
        cand_ids [B, C] raw candidate item ids; past_k/v [L, B, P, H, D] (user b's first past_len[b]
        rows are real). Returns logits [B, C, 8] fp32 and the new tokens' keys/values [L, B, Nh, H, D].
        """
        batch, n_hist, n_cand, n_past = hist_ids.shape[0], hist_ids.shape[1], cand_ids.shape[1], past_k.shape[2]
        new = torch.arange(n_hist, device=hist_ids.device)
        hist_pos = past_len[:, None] + new[None, :]  # absolute positions, [B, Nh]
        cand_pos = (past_len + hist_len)[:, None].expand(batch, n_cand)  # right after the history
        x = torch.cat([
            self.embed(hist_ids, history_kinds(hist_pos), hist_pos),
            self.embed(cand_ids, torch.full_like(cand_ids, ITEM_KIND), cand_pos),
        ], dim=1)
        blocked = ~_attention_mask(hist_pos, new[None, :] < hist_len[:, None], past_len, n_past, n_cand)
        new_k, new_v = [], []
        for layer, pk, pv in zip(self.layers, past_k, past_v):
            x, k, v = layer(x, pk, pv, blocked)
            new_k.append(k[:, :n_hist])
            new_v.append(v[:, :n_hist])
        logits = self.head(x[:, n_hist:]).float()
        return logits, torch.stack(new_k), torch.stack(new_v)


def _attention_mask(hist_pos: Tensor, hist_valid: Tensor, past_len: Tensor, n_past: int, n_cand: int) -> Tensor:
    """[B, Nh+C, P+Nh+C]: history causal; a candidate sees all history and itself; pads nothing."""
    batch, device = hist_pos.shape[0], hist_pos.device
    past = torch.arange(n_past, device=device)[None, :].expand(batch, n_past)
    hidden = torch.full((batch, n_cand), _HIDDEN, dtype=torch.int64, device=device)
    key_pos = torch.cat([
        torch.where(past < past_len[:, None], past, _HIDDEN),
        torch.where(hist_valid, hist_pos, _HIDDEN),
        hidden,
    ], dim=1)
    query_pos = torch.cat([hist_pos, hidden - 1], dim=1)  # a candidate sees every real history key
    causal = key_pos[:, None, :] <= query_pos[:, :, None]
    n_hist = hist_pos.shape[1]
    cand = torch.arange(n_cand, device=device)
    query_cand = torch.cat([torch.full((n_hist,), -1, device=device), cand])
    key_cand = torch.cat([torch.full((n_past + n_hist,), -2, device=device), cand])
    return causal | (query_cand[:, None] == key_cand[None, :])[None]


class KVStep(nn.Module):
    """One user's step as exported: 1-D inputs, every dynamic size padded to at least MIN_SIZE.

    lens = (P, Nh, C) are the real sizes; rows past them are pads and their outputs are garbage.
    """

    def __init__(self, model: HSTUModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, hist_ids: Tensor, cand_ids: Tensor, past_k: Tensor, past_v: Tensor, lens: Tensor):
        logits, k, v = self.model(
            hist_ids[None], lens[1:2], cand_ids[None], past_k[:, None], past_v[:, None], lens[0:1]
        )
        return logits[0], k[:, 0], v[:, 0]


class JaggedRanker(nn.Module):
    """The published no-cache interface: (values, lengths, num_candidates) -> logits [N, 8].

    The jagged batch is gathered into a fixed [max_batch, max sequence] layout (no data-dependent
    shapes until the final selection of real candidates), then ranked cold. Out-of-limit inputs
    are not checked here: indices are clamped, so they give wrong logits rather than a crash.
    """

    def __init__(self, model: HSTUModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, values: Tensor, lengths: Tensor, num_candidates: Tensor) -> Tensor:
        cfg = self.model.config
        batch, last = num_candidates.shape[0], values.shape[0] - 1
        slot = torch.arange(cfg.max_batch, device=values.device)
        user, real = slot.clamp(max=batch - 1), slot < batch
        starts = torch.cumsum(lengths, 0) - lengths
        items = starts[ITEM_KIND * batch + user]  # where each user's video ids start
        n_hist = lengths[ITEM_KIND * batch + user] - num_candidates[user]
        hist_len = torch.where(real, history_tokens(n_hist.clamp(0, cfg.max_history)), 0)
        token = torch.arange(cfg.max_history_tokens, device=values.device)
        pair = torch.where(token < NUM_CONTEXT_TOKENS, 0, (token - NUM_CONTEXT_TOKENS) // 2)
        hist_idx = starts[history_kinds(token)[None, :] * batch + user[:, None]] + pair[None, :]
        cand = torch.arange(cfg.max_candidates, device=values.device)
        cand_idx = (items + n_hist)[:, None] + cand[None, :]
        past = torch.zeros(cfg.num_layers, cfg.max_batch, 0, cfg.num_heads, cfg.head_dim,
                           dtype=self.model.embed.table.weight.dtype, device=values.device)
        logits, _, _ = self.model(values[hist_idx.clamp(0, last)], hist_len, values[cand_idx.clamp(0, last)],
                                  past, past, torch.zeros_like(hist_len))
        keep = real[:, None] & (cand[None, :] < num_candidates[user][:, None])
        return logits[keep]


class Compute(Protocol):
    """What the engine calls, for one user: eager or AOTI-compiled alike.

    (hist_ids int64 [Nh], cand_ids int64 [C], past_k [L, P, H, D], past_v [L, P, H, D])
    -> (logits fp32 [C, 8], new_k [L, Nh, H, D], new_v [L, Nh, H, D])
    """

    def __call__(self, hist_ids: Tensor, cand_ids: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


def padded_call(step, hist_ids: Tensor, cand_ids: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Call a KVStep-shaped `step` with unpadded tensors; pad in, slice the real rows out."""
    n_past, n_hist, n_cand = past_k.shape[1], hist_ids.shape[0], cand_ids.shape[0]
    lens = torch.tensor([n_past, n_hist, n_cand], dtype=torch.int64, device=hist_ids.device)
    logits, k, v = step(_pad(hist_ids, 0), _pad(cand_ids, 0), _pad(past_k, 1), _pad(past_v, 1), lens)
    return logits[:n_cand], k[:, :n_hist], v[:, :n_hist]


def _pad(t: Tensor, dim: int) -> Tensor:
    short = MIN_SIZE - t.shape[dim]
    if short <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = short
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


class EagerCompute:
    """The eager model behind the engine's `Compute` call."""

    def __init__(self, model: HSTUModel) -> None:
        self.step = KVStep(model).eval()

    def __call__(self, hist_ids: Tensor, cand_ids: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        with torch.inference_mode():
            return padded_call(self.step, hist_ids, cand_ids, past_k, past_v)


def build_model(config: ModelConfig, seed: int = 0, state_dict: Mapping[str, Tensor] | None = None) -> HSTUModel:
    """Weights drawn from `seed` (the global RNG is left as it was), or loaded from `state_dict`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = HSTUModel(config)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(torch_dtype(config)).eval()


@functools.cache  # the same draw in one process: export, serve and their engines ask more than once
def weights_digest(config: ModelConfig, seed: int) -> str:
    """What `build_model(config, seed)` draws, as a short digest (in float32, whatever the config's type):
    a package compiled from other weights, by another version of the model, is not this one."""
    digest = hashlib.sha256()
    for name, weights in build_model(replace(config, dtype="float32"), seed).state_dict().items():
        digest.update(name.encode())
        digest.update(weights.numpy().tobytes())
    return digest.hexdigest()[:16]
