"""Sizes of the reference HSTU ranking model, and the named configurations the tool knows."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hstu_replay.errors import ConfigError
from hstu_replay.interface import NUM_CONTEXT_TOKENS, PUBLISHED_LIMITS, Limits, history_tokens, user_values

DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model. Large id spaces are hashed into the tables: row = id % table size."""

    name: str
    num_layers: int
    hidden_dim: int
    num_heads: int
    head_dim: int
    max_history: int  # items; a history of h items is 6 + 2h tokens
    max_candidates: int
    item_table_size: int
    user_table_size: int
    context_table_size: int  # each of the five contextual features has its own table this size
    action_table_size: int = 256  # the action bitmask has 8 bits
    dtype: str = "float32"
    #: Attention scores are divided by this constant, never by the actual length, so a token's
    #: output does not depend on how much of the sequence was cached.
    attn_normaliser: float = 1.0
    max_batch: int = PUBLISHED_LIMITS.max_batch  # users per request (the published export limit)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"model dtype {self.dtype!r} unknown; choose one of {', '.join(DTYPES)}")
        sizes = (self.num_layers, self.hidden_dim, self.num_heads, self.head_dim, self.max_history,
                 self.max_candidates, self.item_table_size, self.user_table_size,
                 self.context_table_size, self.action_table_size, self.max_batch)
        if min(sizes) < 1 or self.attn_normaliser <= 0:
            raise ConfigError(f"model config {self.name!r}: every size must be positive")

    @property
    def max_history_tokens(self) -> int:
        """KV tokens of the longest history: 6 contextual + item/action pairs."""
        return history_tokens(self.max_history)

    @property
    def limits(self) -> Limits:
        """What a request to this model may hold (the served models publish it): a full batch of the
        longest histories with the most candidates, 6 contextual values + 2 per item and per candidate."""
        most_values = self.max_batch * user_values(self.max_history, self.max_candidates)
        return Limits(self.max_batch, most_values, self.max_candidates, self.max_history)

    @property
    def max_positions(self) -> int:
        """Rows of the position table: every history position, plus the candidates' one."""
        return self.max_history_tokens + 1

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def num_context_tokens(self) -> int:
        return NUM_CONTEXT_TOKENS


_KUAIRAND = ModelConfig(
    name="kuairand-1k",
    num_layers=3,
    hidden_dim=512,
    num_heads=4,
    head_dim=128,
    max_history=PUBLISHED_LIMITS.max_history,
    max_candidates=PUBLISHED_LIMITS.max_candidates,
    item_table_size=100_000,
    user_table_size=1_000,
    context_table_size=64,
    attn_normaliser=8320.0,  # the published package's padded maximum sequence
)

CONFIGS: dict[str, ModelConfig] = {
    c.name: c
    for c in (
        _KUAIRAND,
        ModelConfig(**{**_KUAIRAND.__dict__, "name": "kuairand-1k-8l", "num_layers": 8}),
        ModelConfig(
            name="small",
            num_layers=2,
            hidden_dim=64,
            num_heads=2,
            head_dim=32,
            max_history=256,
            max_candidates=32,
            item_table_size=1_000,
            user_table_size=128,
            context_table_size=16,
            attn_normaliser=576.0,
        ),
    )
}


def get_config(name: str, dtype: str | None = None) -> ModelConfig:
    """The named config, in `dtype` when one is given (else the config's own)."""
    try:
        config = CONFIGS[name]
    except KeyError:
        raise ConfigError(f"unknown model config {name!r}; known: {', '.join(sorted(CONFIGS))}") from None
    return config if dtype is None else replace(config, dtype=dtype)
