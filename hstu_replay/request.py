"""The jagged request layout of the HSTU ranking models, and its inverse.

A batch of B users is feature-major: `lengths[f*B + b]` is the length of feature f for user b,
and `values` concatenates feature by feature, user by user (see interface.FEATURE_KEYS).
Building one is a handful of slices, no Python loop over tokens and no copy: `values` is kept as
the pieces it is laid out from, which the transports send as they lie in memory; they are
joined only when something asks for the whole array.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hstu_replay.errors import InputError, LimitError
from hstu_replay.interface import (
    NUM_CONTEXT_TOKENS,
    NUM_FEATURES,
    PUBLISHED_LIMITS,
    Limits,
    ModelInterface,
    history_tokens,
    user_values,
)

_INT64 = np.dtype(np.int64)


@dataclass(frozen=True)
class UserRequest:
    """One user's part of a request: a history slice to reuse or extend, then candidates."""

    user_id: int
    context: tuple[int, ...]  # the five re-coded contextual features, CONTEXT_KEYS order
    history_items: np.ndarray  # int64 video ids, oldest first
    history_actions: np.ndarray  # int64 action bitmasks, same length
    candidates: np.ndarray  # int64 video ids to rank
    cache_key: int | None = None  # INPUT__3; defaults to user_id

    @property
    def key(self) -> int:
        return self.user_id if self.cache_key is None else self.cache_key

    def with_key(self, key: int) -> UserRequest:
        """The same user on cache key `key` (cheaper than dataclasses.replace on the hot path)."""
        return UserRequest(self.user_id, self.context, self.history_items, self.history_actions, self.candidates, key)

    @property
    def history_length(self) -> int:
        return len(self.history_items)

    @property
    def total_history_length(self) -> int:
        return history_tokens(len(self.history_items))

    @property
    def num_values(self) -> int:
        """How many entries of `values` this user takes: one per contextual feature, then item
        and action per history item and per candidate."""
        return user_values(len(self.history_items), len(self.candidates))


@dataclass(frozen=True)
class RequestTensors:
    """The five int64 tensors of the KV-cache model; the other interfaces take a subset.

    `value_parts` are contiguous int64 arrays that, laid end to end, are `values`."""

    value_parts: tuple[np.ndarray, ...]
    lengths: np.ndarray
    num_candidates: np.ndarray
    user_ids: np.ndarray
    total_history_lengths: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, lengths: np.ndarray, num_candidates: np.ndarray, user_ids: np.ndarray,
           total_history_lengths: np.ndarray) -> RequestTensors:
        """From whole arrays (as read from a dump or a trace)."""
        return cls((_int64(values),), lengths, num_candidates, user_ids, total_history_lengths)

    @cached_property
    def values(self) -> np.ndarray:
        parts = self.value_parts
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @property
    def batch_size(self) -> int:
        return len(self.num_candidates)

    @cached_property
    def num_logits(self) -> int:
        return int(self.num_candidates.sum())

    def inputs(self, interface: ModelInterface) -> dict[str, np.ndarray]:
        """The input tensors `interface` takes, by Triton input name."""
        return {name: getattr(self, field) for field, name in interface.field_to_input.items()}

    def input_parts(self, interface: ModelInterface) -> list[tuple[str, tuple[np.ndarray, ...]]]:
        """The same inputs, each as the contiguous int64 pieces that make it up, in order."""
        return [(name, self.value_parts if field == "values" else (getattr(self, field),))
                for field, name in interface.field_to_input.items()]

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, np.ndarray], interface: ModelInterface) -> RequestTensors:
        """Rebuild from a model's input tensors; fields the interface lacks are derived."""
        missing = [n for n in interface.field_to_input.values() if n not in inputs]
        if missing:
            raise InputError(f"request lacks input(s) {missing} of model {interface.model_name}")
        fields = {f: np.asarray(inputs[n]) for f, n in interface.field_to_input.items()}
        for field, array in fields.items():
            if array.dtype != _INT64 or array.ndim != 1:
                raise InputError(f"{field} must be a 1-D int64 tensor, got {array.dtype} {list(array.shape)}")
        users = _split(fields["values"], fields["lengths"], fields["num_candidates"])
        if "user_ids" not in fields:
            fields["user_ids"] = np.array([u.user_id for u in users], dtype=np.int64)
        derived = np.array([u.total_history_length for u in users], dtype=np.int64)
        if "total_history_lengths" in fields:
            if not np.array_equal(fields["total_history_lengths"], derived):
                raise InputError(
                    f"total_history_lengths {fields['total_history_lengths'].tolist()} "
                    f"disagree with the layout, which implies {derived.tolist()}"
                )
        else:
            fields["total_history_lengths"] = derived
        return cls.of(**fields)

    def users(self) -> list[UserRequest]:
        """The per-user records this request carries (zero-copy views of `values`)."""
        users = _split(self.values, self.lengths, self.num_candidates)
        return [
            UserRequest(u.user_id, u.context, u.history_items, u.history_actions, u.candidates, int(k))
            for u, k in zip(users, self.user_ids)
        ]


def build_request(users: Sequence[UserRequest], limits: Limits = PUBLISHED_LIMITS) -> RequestTensors:
    """Lay out `users` as one jagged batch, refusing (one clear line) a request the model cannot
    take under `limits`. One pass over the users for the checks and the layout, plain lists for
    the per-user numbers: at B <= 8 they are cheaper than numpy calls on tiny arrays."""
    batch = len(users)
    if not limits.takes_batch(batch):
        raise LimitError(f"batch of {batch} users; the model takes {limits.batch_range}")
    items: list[np.ndarray] = []
    actions: list[np.ndarray] = []
    histories, candidates, contexts, keys = [], [], [], []
    head = []  # feature-major: every user's id, then each context feature
    max_history, max_candidates = limits.max_history, limits.max_candidates
    for u in users:
        history, ranked = u.history_items, u.candidates
        h, c = len(history), len(ranked)
        if len(u.history_actions) != h:
            raise LimitError(f"user {u.user_id}: {h} history items but {len(u.history_actions)} actions")
        if h > max_history:
            raise LimitError(f"user {u.user_id}: history of {h} items exceeds {max_history}")
        if c > max_candidates:
            raise LimitError(f"user {u.user_id}: {c} candidates exceed {max_candidates}")
        items += (_int64(history), _int64(ranked))
        actions += (_int64(u.history_actions), _zeros(c))
        histories.append(h)
        candidates.append(c)
        contexts += u.context
        keys.append(u.key)
        head.append(u.user_id)
    if len(set(keys)) != batch:
        twice = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise LimitError(f"cache key {twice} appears twice in one request; the server would corrupt it")
    sequences = [h + c for h, c in zip(histories, candidates)]
    total = NUM_CONTEXT_TOKENS * batch + 2 * sum(sequences)
    if total > limits.max_values:
        raise LimitError(f"request has {total} values; the model takes at most {limits.max_values}")
    for f in range(NUM_CONTEXT_TOKENS - 1):
        head += contexts[f :: NUM_CONTEXT_TOKENS - 1]
    return RequestTensors(
        value_parts=(np.array(head, dtype=np.int64), *items, *actions),
        lengths=np.array([1] * (NUM_CONTEXT_TOKENS * batch) + sequences * 2, dtype=np.int64),
        num_candidates=np.array(candidates, dtype=np.int64),
        user_ids=np.array(keys, dtype=np.int64),
        total_history_lengths=np.array([history_tokens(h) for h in histories], dtype=np.int64),
    )


def _int64(array: np.ndarray) -> np.ndarray:
    """`array` as contiguous int64 (itself when it already is: no copy)."""
    if array.dtype == _INT64 and array.flags.c_contiguous:
        return array
    if not np.can_cast(array.dtype, _INT64, "same_kind"):
        raise InputError(f"cannot send {array.dtype} values as int64")
    return np.ascontiguousarray(array, dtype=_INT64)


_ZEROS = np.zeros(0, dtype=_INT64)
_ZEROS.flags.writeable = False


def _zeros(count: int) -> np.ndarray:
    """A read-only run of `count` int64 zeros (the candidates' action slots), shared."""
    global _ZEROS
    if len(_ZEROS) < count:
        _ZEROS = np.zeros(max(count, 2 * len(_ZEROS)), dtype=_INT64)
        _ZEROS.flags.writeable = False
    return _ZEROS[:count]


def _split(values: np.ndarray, lengths: np.ndarray, num_candidates: np.ndarray) -> list[UserRequest]:
    """Inverse of the layout, with every structural check the server would rely on."""
    batch = len(num_candidates)
    if batch == 0 or len(lengths) != NUM_FEATURES * batch:
        raise InputError(f"lengths has {len(lengths)} entries; expected {NUM_FEATURES} x {batch} users")
    if np.any(lengths < 0) or np.any(num_candidates < 0):
        raise InputError("negative length or candidate count")
    if np.any(lengths[: NUM_CONTEXT_TOKENS * batch] != 1):
        raise InputError("every contextual feature must have length 1 per user")
    items_len = lengths[NUM_CONTEXT_TOKENS * batch : (NUM_CONTEXT_TOKENS + 1) * batch]
    if not np.array_equal(items_len, lengths[(NUM_CONTEXT_TOKENS + 1) * batch :]):
        raise InputError("video_id and action_weights lengths differ")
    if int(lengths.sum()) != len(values):
        raise InputError(f"lengths sum to {int(lengths.sum())} but values has {len(values)}")
    if np.any(num_candidates > items_len):
        raise InputError("a user has more candidates than items")
    # the per-user numbers as Python ints in one conversion each: cheaper than indexing numpy per user
    head = values[: NUM_CONTEXT_TOKENS * batch].reshape(NUM_CONTEXT_TOKENS, batch).T.tolist()
    item_starts = (NUM_CONTEXT_TOKENS * batch + np.concatenate([[0], np.cumsum(items_len)])).tolist()
    total_items = item_starts[-1] - item_starts[0]
    hists = (items_len - num_candidates).tolist()
    users = []
    for b in range(batch):
        hist, first = hists[b], item_starts[b]
        items = values[first : item_starts[b + 1]]
        actions_at = first + total_items
        users.append(
            UserRequest(
                user_id=head[b][0],
                context=tuple(head[b][1:]),
                history_items=items[:hist],
                history_actions=values[actions_at : actions_at + hist],
                candidates=items[hist:],
            )
        )
    return users
