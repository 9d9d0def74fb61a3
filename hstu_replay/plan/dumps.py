"""Dump replay: the users of NVIDIA reference-dump batches, each checked against its logits.

HSTU ranks each user independently of its batch-mates, so every dumped user carries its own
rows of the reference logits; a step takes the next B users from the pool, whatever batches
they were dumped in. Every replay uses fresh cache keys (dumps are cold-cache runs), so a
target hit ratio is reached by priming each key with a prefix of the same user's history
first. The values sent are the dumped ones, unchanged: the reference logits stay valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hstu_replay.errors import ConfigError
from hstu_replay.interface import NOCACHE, Limits, history_tokens
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.reuse import prime_items
from hstu_replay.plan.step import PlannedStep
from hstu_replay.request import RequestTensors, UserRequest, build_request


@dataclass(frozen=True)
class DumpedUser:
    request: UserRequest
    reference: np.ndarray | None  # this user's rows of the reference logits
    label: str  # e.g. "batch_000003 user 2"


def dumped_users(batches: Sequence) -> list[DumpedUser]:
    """Split `dumps.DumpBatch`es into per-user records with their reference rows."""
    pool = []
    for batch in batches:
        t = batch.tensors
        request = RequestTensors.from_inputs(
            {"INPUT__0": t["values"], "INPUT__1": t["lengths"], "INPUT__2": t["num_candidates"]}, NOCACHE)
        logits = batch.logits
        if logits is not None and len(logits) != request.num_logits:
            raise ConfigError(f"{batch.name}: {len(logits)} logit rows for {request.num_logits} candidates")
        ends = np.cumsum(request.num_candidates)
        for i, user in enumerate(request.users()):
            rows = None if logits is None else logits[ends[i] - request.num_candidates[i] : ends[i]]
            pool.append(DumpedUser(user, rows, f"{batch.name} user {i}"))
    return pool


class DumpSource:
    def __init__(self, pool: Sequence[DumpedUser], keys: KeyAllocator, limits: Limits):
        if not pool:
            raise ConfigError("the dump directory holds no users")
        self.pool, self.keys, self.limits = list(pool), keys, limits
        self._next = 0

    def next_step(self, target: float, batch_size: int) -> PlannedStep:
        chosen = [self.pool[(self._next + i) % len(self.pool)] for i in range(min(batch_size, len(self.pool)))]
        self._next += len(chosen)
        users = [replace(d.request, cache_key=self.keys.new_key()) for d in chosen]
        primes, hits = [], []
        for user in users:
            prefix = prime_items(target, user.history_length)
            hits.append(history_tokens(prefix) if prefix is not None else 0)
            if prefix is not None:
                primes.append(replace(user, history_items=user.history_items[:prefix],
                                      history_actions=user.history_actions[:prefix], candidates=user.candidates[:1]))
        references = [d.reference for d in chosen]
        return PlannedStep(
            request=build_request(users, self.limits),
            expected_hits=tuple(hits),
            prime=build_request(primes, self.limits) if primes else None,
            reference=None if any(r is None for r in references) else np.concatenate(references),
            label="; ".join(d.label for d in chosen),
            target_ratio=target,
        )
