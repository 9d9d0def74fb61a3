"""The protocol's input: logical batches ("cases") of B users, from a dump or a prepared store.

NVIDIA's replay client loads its cases, re-batches them and generates user ids before any
timing starts; so does this module. Every user appears in one case only, so a pass over the
cases sends each cache key once: pass 1 finds nothing cached, pass 2 (the same keys) finds
every history cached. Keys are fresh for each run (a random nonce in the high bits, as the
load test's keys), so a server that still holds earlier keys gives no false hits.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.request import RequestTensors, UserRequest, build_request

KEY_BASE = 1 << 52  # above any real KuaiRand user id and the dump writer's keys (1 << 40 ...)


@dataclass(frozen=True)
class ProtocolUser:
    request: UserRequest
    reference: np.ndarray | None  # the user's rows of the reference logits, when the source has them


@dataclass(frozen=True)
class Case:
    """One Triton call's worth of users, laid out once, before any timing."""

    tensors: RequestTensors
    reference: np.ndarray | None  # logits rows of every user, in batch order; None without references

    @property
    def batch_size(self) -> int:
        return self.tensors.batch_size


def users_from_dumps(directory: str) -> list[ProtocolUser]:
    """Every dumped user, with its reference rows (`compiled_logits` or `ref_logits`)."""
    from hstu_replay.dumps.reader import read_dump
    from hstu_replay.plan.dumps import dumped_users

    return [ProtocolUser(d.request, d.reference) for d in dumped_users(read_dump(directory))]


def users_from_store(path: str, candidates: int, max_history: int) -> list[ProtocolUser]:
    """Each user of the store once: its latest `candidates` events ranked after up to
    `max_history` events before them. No references: a store carries none."""
    from hstu_replay.data.store import SequenceStore

    store = SequenceStore.open(path)
    users = []
    for history in store:
        n = len(history.video_ids)
        if n <= candidates:
            continue
        start = max(0, n - candidates - max_history)
        users.append(ProtocolUser(UserRequest(
            user_id=history.user_id, context=history.context,
            history_items=np.asarray(history.video_ids[start:n - candidates], dtype=np.int64),
            history_actions=np.asarray(history.actions[start:n - candidates], dtype=np.int64),
            candidates=np.asarray(history.video_ids[n - candidates:], dtype=np.int64),
        ), None))
    return users


def make_cases(users: Sequence[ProtocolUser], batch_size: int, cases: int | None, limits: Limits,
               nonce: int | None = None) -> list[Case]:
    """`cases` calls of `batch_size` users each (all the users allow when None), every user on a
    fresh cache key of its own. The first case is the warm-up, so at least two are needed."""
    available = len(users) // batch_size
    wanted = available if cases is None else cases
    if available < 2 or wanted > available:
        raise ConfigError(f"batch size {batch_size}: {len(users)} users make {available} cases; "
                          f"the protocol needs {max(wanted, 2)} (one warm-up, then the measured ones)")
    if wanted < 2:
        raise ConfigError(f"--cases {wanted}: give at least 2 (one warm-up, then the measured ones)")
    nonce = secrets.randbits(20) if nonce is None else nonce
    out = []
    for c in range(wanted):
        chosen = users[c * batch_size:(c + 1) * batch_size]
        keyed = [u.request.with_key(KEY_BASE + (nonce << 24) + c * batch_size + i) for i, u in enumerate(chosen)]
        references = [u.reference for u in chosen]
        out.append(Case(build_request(keyed, limits),
                        None if any(r is None for r in references) else np.concatenate(references)))
    return out
