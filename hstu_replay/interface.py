"""The HSTU ranking models' Triton interface: feature order, tensor signatures and limits.

One source of truth for the request layout, the reference target, the client's model check and
the dump files. Facts from NVIDIA's recsys-examples (examples/hstu/inference_aoti).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Feature keys of the jagged batch, in the order they appear in `lengths` and `values`.
FEATURE_KEYS: tuple[str, ...] = (
    "user_id",
    "user_active_degree",
    "follow_user_num_range",
    "fans_user_num_range",
    "friend_user_num_range",
    "register_days_range",
    "video_id",
    "action_weights",
)
#: The five contextual user features (after user_id), re-coded 1..k.
CONTEXT_KEYS: tuple[str, ...] = FEATURE_KEYS[1:6]
NUM_CONTEXT_TOKENS = 6  # user_id + the five contextual features
NUM_FEATURES = len(FEATURE_KEYS)
NUM_TASKS = 8  # logits per candidate, one per action bit

#: Action bitmask weights (bit i is task i of the logits).
ACTION_BITS: tuple[tuple[str, int], ...] = (
    ("is_click", 1),
    ("is_like", 2),
    ("is_follow", 4),
    ("is_comment", 8),
    ("is_forward", 16),
    ("is_hate", 32),
    ("long_view", 64),
    ("is_profile_enter", 128),
)


def history_tokens(history_items: int) -> int:
    """KV tokens a history of `history_items` items occupies: 6 contextual + item/action pairs
    (elementwise for an array of counts)."""
    return NUM_CONTEXT_TOKENS + 2 * history_items


def user_values(history_items: int, candidates: int) -> int:
    """Values one user adds to a request: 6 contextual, then an item and an action for each history
    item and each candidate (a candidate's action is 0)."""
    return history_tokens(history_items + candidates)


#: Where a server listens unless told: tritonserver's own default ports (HTTP, gRPC, metrics), and
#: the reference server's KV-cache counters on the port after them.
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
DEFAULT_METRICS_PORT = 8002
DEFAULT_CACHE_METRICS_PORT = 8003
#: The Triton address a client sends to unless told: gRPC on loopback.
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_GRPC_PORT}"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # Triton dtype name: INT64, FP32
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelInterface:
    """A served model's signature and how our request fields map onto its inputs."""

    name: str  # short name used in options: kvcache, nocache, python
    model_name: str  # the published Triton model name
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: request field -> input tensor name, for the fields this model takes
    field_to_input: dict[str, str]
    logits_output: str
    #: whether the model keeps a KV cache keyed by `user_ids` (declared, not guessed from field
    #: names: the Python-backend model takes user ids but caches nothing)
    uses_cache: bool = False
    #: outputs the reference target adds beyond the published signature (NVIDIA's server sends none)
    extensions: tuple[TensorSpec, ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    def signature(self) -> str:
        ins = ", ".join(f"{t.name}:{t.dtype}{list(t.dims)}" for t in self.inputs)
        outs = ", ".join(f"{t.name}:{t.dtype}{list(t.dims)}" for t in self.outputs)
        return f"inputs({ins}) outputs({outs})"


def _int64(name: str) -> TensorSpec:
    return TensorSpec(name, "INT64", (-1,))


KVCACHE = ModelInterface(
    name="kvcache",
    model_name="hstu_gr_ranking_kvcache",
    inputs=tuple(_int64(f"INPUT__{i}") for i in range(5)),
    outputs=(TensorSpec("OUTPUT__0", "FP32", (-1, NUM_TASKS)), _int64("OUTPUT__1")),
    field_to_input={
        "values": "INPUT__0",
        "lengths": "INPUT__1",
        "num_candidates": "INPUT__2",
        "user_ids": "INPUT__3",
        "total_history_lengths": "INPUT__4",
    },
    logits_output="OUTPUT__0",
    uses_cache=True,
    # CACHED_TOKENS: tokens reused per user, both tiers; HOST_CACHED_TOKENS: the part onboarded from the host tier
    extensions=(_int64("CACHED_TOKENS"), _int64("HOST_CACHED_TOKENS")),
)

NOCACHE = ModelInterface(
    name="nocache",
    model_name="hstu_gr_ranking",
    inputs=tuple(_int64(f"INPUT__{i}") for i in range(3)),
    outputs=(TensorSpec("OUTPUT__0", "FP32", (-1, NUM_TASKS)),),
    field_to_input={"values": "INPUT__0", "lengths": "INPUT__1", "num_candidates": "INPUT__2"},
    logits_output="OUTPUT__0",
)

PYTHON_BACKEND = ModelInterface(
    name="python",
    model_name="hstu_model",
    inputs=tuple(_int64(n) for n in ("USER_IDS", "TOKEN_LENGTHS", "TOKENS", "NUM_CANDIDATES")),
    outputs=(TensorSpec("OUTPUT", "FP32", (-1, NUM_TASKS)),),
    field_to_input={
        "user_ids": "USER_IDS",
        "lengths": "TOKEN_LENGTHS",
        "values": "TOKENS",
        "num_candidates": "NUM_CANDIDATES",
    },
    logits_output="OUTPUT",
)

#: Registry of known interfaces, by short name.
INTERFACES: dict[str, ModelInterface] = {i.name: i for i in (KVCACHE, NOCACHE, PYTHON_BACKEND)}
#: The reference server's own model beside the published ones: reads and empties its KV cache.
CONTROL_MODEL = "hstu_kvcache_control"


@dataclass(frozen=True)
class Limits:
    """Export-time limits of the published package; a request outside them is refused."""

    max_batch: int = 8
    max_values: int = 40_000
    max_candidates: int = 100
    max_history: int = 4096

    def history_cap(self, batch_size: int, candidates: int) -> int:
        """Longest history (items) each of `batch_size` users with `candidates` candidates may
        send so that the whole request stays within `max_values` (and `max_history`)."""
        per_user = self.max_values // batch_size  # the inverse of `user_values`
        return min(self.max_history, (per_user - NUM_CONTEXT_TOKENS) // 2 - candidates)

    @property
    def batch_range(self) -> str:
        """The batch sizes (users per request) a request may have, as messages and help texts write them."""
        return f"1..{self.max_batch}"

    def takes_batch(self, batch: int) -> bool:
        """Whether a request of `batch` users is within the limit: the one batch-size check."""
        return 1 <= batch <= self.max_batch

    def parameters(self) -> dict[str, str]:
        """The limits as a served model's configuration publishes them (`LIMIT_PARAMETERS`)."""
        return {name: str(getattr(self, field)) for field, name in LIMIT_PARAMETERS.items()}


PUBLISHED_LIMITS = Limits()
#: `Limits` field -> the parameter of a served model's configuration (Triton's model config
#: `parameters`, string values) that publishes it: written by the reference server, read by the client
LIMIT_PARAMETERS: dict[str, str] = {
    "max_batch": "hstu_max_batch",
    "max_values": "hstu_max_values",
    "max_candidates": "hstu_max_candidates",
    "max_history": "hstu_max_history_items",
}
