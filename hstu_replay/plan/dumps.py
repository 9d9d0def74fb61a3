"""Dump replay: the users of NVIDIA reference-dump batches, each checked against its logits.

HSTU ranks each user independently of its batch-mates, so every dumped user carries its own
rows of the reference logits; a step takes B distinct users from the process's dealer,
whatever batches they were dumped in. The values sent are the dumped ones, unchanged: the
reference logits stay valid. Hits come from reuse where they can, as NVIDIA's replay client
gets them (pass 1 cold, pass 2 on the same keys): at target 1.0 a dumped user whose key already
holds its full history is sent again on that key, with no prime. Between 0 and 1, by default
(`PartialHits.PRIME`) each request takes a fresh key, primed with a prefix of the same user's
history to reach the target (a priming request the server computes too; the report counts it).
With `PartialHits.REUSE` (a `HitMix` given) there are no primes: a dumped user whose key holds
its full history is sent again on it (a full hit) or on a fresh key (a miss, which fills that
key for a later hit), whichever keeps the process's hit tokens at the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hstu_replay.errors import ConfigError, HstuReplayError
from hstu_replay.interface import NOCACHE, Limits, history_tokens
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.reuse import HitMix, prime_items
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


@dataclass(frozen=True)
class KnownAnswer:
    """A cold request of dumped users whose answer the dump holds (`labels`: each user's)."""

    request: RequestTensors
    reference: np.ndarray
    labels: tuple[str, ...]


def known_answers(pool: Sequence[DumpedUser], batch_size: int, count: int, keys: KeyAllocator,
                  limits: Limits) -> list[KnownAnswer]:
    """The first `count` requests of `batch_size` dumped users, in the dump's order, each user on a key
    of `keys` never sent before (cold, as the dump was written); none where the dump has no logits."""
    if any(d.reference is None for d in pool):
        return []
    chunks = [pool[i:i + batch_size] for i in range(0, min(len(pool), batch_size * count), batch_size)]
    return [KnownAnswer(build_request([d.request.with_key(keys.new_key()) for d in chunk], limits),
                        np.concatenate([d.reference for d in chunk]), tuple(d.label for d in chunk))
            for chunk in chunks]


def pool_identities(pool: Sequence[DumpedUser]) -> list[int]:
    """The store user behind each dumped user (one user may be dumped in several batches)."""
    return [d.request.user_id for d in pool]


@dataclass
class _Held:
    key: int
    tokens: int


class DumpSource:
    """One virtual user's stream of dump-replay steps. `held` is the process's book of which
    dumped user's key holds its full history (shared by every virtual user of the process)."""

    def __init__(self, pool: Sequence[DumpedUser], dealer: Dealer, held: dict[int, _Held], keys: KeyAllocator,
                 limits: Limits, mix: HitMix | None = None):
        self.pool, self.dealer, self.held, self.keys, self.limits = pool, dealer, held, keys, limits
        self.mix = mix  # the process's tally, where partial ratios come from reuse (None: from primes)

    @property
    def exhausted(self) -> bool:
        return False  # users are dealt again and again: never runs dry

    def next_step(self, target: float, batch_size: int) -> PlannedStep:
        chosen: list[int] = []
        try:
            for _ in range(batch_size):
                chosen.append(self.dealer.take(exclude={self.dealer.identity(i) for i in chosen}))
            return self._step(chosen, target)
        except HstuReplayError:  # nothing is sent: the dumped users are free again
            for i in chosen:
                self.dealer.release(i)
            raise

    def _step(self, chosen: list[int], target: float) -> PlannedStep:
        users, primes, hits, handles = [], [], [], []
        for i in chosen:
            user = self.pool[i].request
            owner = self.dealer.holders(i) == 1  # no other step has this dumped user in flight
            book = self.held.get(i) if owner else None
            tokens = user.total_history_length
            warm = book is not None and book.tokens == tokens
            mixed = self.mix is not None and 0.0 < target < 1.0
            if warm and (target >= 1.0 or mixed and self.mix.wants_hit(target, tokens)):
                users.append(user.with_key(book.key))  # reuse: a full hit, no prime
                hits.append(book.tokens)
            else:
                user = user.with_key(self.keys.new_key())
                users.append(user)
                prefix = None if mixed else prime_items(target, user.history_length)
                hits.append(history_tokens(prefix) if prefix is not None else 0)
                if prefix is not None:
                    primes.append(replace(user, history_items=user.history_items[:prefix],
                                          history_actions=user.history_actions[:prefix],
                                          candidates=user.candidates[:1]))
            if mixed and warm:
                self.mix.book(target, hits[-1], tokens)
            elif mixed:
                self.mix.missed(target, tokens)
            handles.append((i, users[-1].key, tokens, owner))
        references = [self.pool[i].reference for i in chosen]
        return PlannedStep(
            request=build_request(users, self.limits),
            expected_hits=tuple(hits),
            prime=build_request(primes, self.limits) if primes else None,
            reference=None if any(r is None for r in references) else np.concatenate(references),
            label="; ".join(self.pool[i].label for i in chosen),
            goal_ratio=target,
            handles=tuple(handles),
        )

    def reset(self) -> None:
        """The server lost its cache: no dumped user's key holds anything any more."""
        self.held.clear()

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        """Book the keys that now hold their user's full history; release the dumped users.
        Returns the keys never to be sent again (replaced, failed, or used once)."""
        retired = []
        for i, key, tokens, owner in step.handles:
            booked = self.held.pop(i, None) if owner else None
            if booked is not None and booked.key != key:
                retired.append(booked.key)
            if owner and ok:
                self.held[i] = _Held(key, tokens)
            else:
                retired.append(key)
            self.dealer.release(i)
        return retired
