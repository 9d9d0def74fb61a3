"""Session replay from a prepared KuaiRand store, with the hit ratio under control.

Each batch slot walks through users' real histories. A warm key grows by exactly the number
of events that puts the next request at the target hit ratio; when that is out of reach (the
history would exceed the limit, or the key is new), the slot starts a fresh key, primes it
with a prefix of the right length and then asks for the next natural visit (events up to the
next gap of 60 s or more). Candidates are the events that follow the history. At batch B a
history is capped (from its start, so keys still only grow) where B such users fit the model's
`max_values`.

With a tier mix (`TierSteering`) each slot is also steered to a cache tier by choosing which of
its virtual user's keys it sends (the working set: the keys it sent before, parked), against the
client's two-tier model of the server: a GPU hit is a fresh key primed to the stage's ratio
(the GPU holds the prime); a host hit grows a key only the host pool holds, the middle one of
those by recency; a miss is a fresh key sent cold. Every fresh key joins the working set and
pushes the least recent one out of the GPU, so keys age into the host pool while they can still
grow. Parked keys that neither pool holds any more, or that cannot grow, are retired. Why the
middle host-only key: under a master and workers each process models its share of pools that
the processes share, so a key near either edge of the host-only range in the model may sit
across that edge on the server (still on the GPU, or gone); the middle one is host-only there too.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

import numpy as np

from hstu_replay.interface import Limits, history_tokens
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.retired import RetiredKeys
from hstu_replay.plan.reuse import prime_items, warm_items
from hstu_replay.plan.step import PlannedStep
from hstu_replay.plan.tier_mix import TierMix, TierPattern
from hstu_replay.plan.tiers import Tier
from hstu_replay.request import UserRequest, build_request

SESSION_GAP_MS = 60_000


@dataclass
class _Slot:
    user: int = -1  # store index (held from the dealer)
    key: int | None = None
    sent: int = 0  # history items the key holds (as far as this slot knows)
    history: SlotHistory | None = None  # the held user's arrays, read once when the slot takes it


@dataclass(frozen=True)
class SlotHistory:
    """What a slot sends of its user, read from the store once per user instead of once per
    request (a store read builds memory-map views: ~25 us each, several per user and step).
    Bounded: one user per slot, at most `max_history + candidates` events of it."""

    user_id: int
    context: tuple[int, ...]
    video_ids: np.ndarray  # int64, plain views of the store's map
    actions: np.ndarray  # int64, converted once (the store keeps uint8)
    events: int  # all the user's events (the arrays may stop earlier)
    visit_starts: list[int]  # a list: bisect on it is cheaper than np.searchsorted on a short array

    @classmethod
    def of(cls, store, user: int, keep: int) -> SlotHistory:
        history = store.user(user)
        ids = np.asarray(history.video_ids)
        # visits that start past `keep` events can never end a request (it stops within them): the
        # times read are the first `keep` + 1, not the user's whole log (pages of a large store untouched)
        return cls(history.user_id, history.context, ids[:keep].astype(np.int64, copy=False),
                   np.asarray(history.actions[:keep], dtype=np.int64), len(ids),
                   visit_starts(history.times_ms[: keep + 1]).tolist())

    def request(self, items: int, candidates: int, key: int) -> UserRequest:
        """The user's first `items` events as history and the next `candidates` as candidates, on `key`."""
        ids = self.video_ids
        return UserRequest(self.user_id, self.context, ids[:items], self.actions[:items],
                           ids[items : items + candidates], key)


def visit_starts(times_ms: np.ndarray) -> np.ndarray:
    """Indexes where a user's visits begin after the first: events after a gap of 60 s or more."""
    return np.flatnonzero(np.diff(np.asarray(times_ms)) >= SESSION_GAP_MS) + 1


def usable_users(store, candidates: int) -> list[int]:
    """Store users with more events than `candidates` (the rest cannot be replayed)."""
    return [u for u in range(len(store)) if len(store.user(u).video_ids) > candidates]


@dataclass(frozen=True)
class TierSteering:
    """What steering by tier needs: the mix, and the process's model of the server's two tiers
    (`CacheModel`: `where(key)` and `held(key)`)."""

    mix: TierMix
    model: object


class SessionSource:
    """One virtual user's stream of session-replay steps; users come from the process's dealer."""

    def __init__(self, store, dealer: Dealer, keys: KeyAllocator, candidates: int, limits: Limits,
                 steering: TierSteering | None = None):
        self.store, self.dealer, self.keys, self.limits = store, dealer, keys, limits
        self.candidates = candidates
        self.steering = steering
        self._pattern = TierPattern(steering.mix) if steering is not None else None
        self._parked: list[_Slot] = []  # the working set: keys sent before, not in a slot now
        self._slots: list[_Slot] = []
        self.retired = RetiredKeys()
        # the last measured request built: (key and history length of each slot), the request, its label.
        # At a hit ratio of 1.0 a warm key is sent again as it was, so the same request is sent again.
        self._last: tuple[tuple, object, str] = ((), None, "")

    @property
    def exhausted(self) -> bool:
        return False  # users are dealt again and again: never runs dry

    def next_step(self, target: float, batch_size: int) -> PlannedStep:
        cap = self.limits.history_cap(batch_size, self.candidates)
        while len(self._slots) < batch_size:
            slot = _Slot()
            self._next_user(slot)
            self._slots.append(slot)
        slots = tuple(self._slots[:batch_size])
        primes, planned, hits = [], [], []
        for slot in slots:
            goal = target if self.steering is None else self._steer(slot, target, cap)
            prime, items, hit = self._plan_slot(slot, goal, cap)
            if prime is not None:
                primes.append(prime)
            planned.append((slot.key, items))
            hits.append(hit)
        planned = tuple(planned)
        if primes or planned != self._last[0]:  # a key and its length name the request: same ones, same request
            measured = [self._user_request(slot, items, self.candidates) for slot, (_, items) in zip(slots, planned)]
            label = "; ".join(f"user {u.user_id} key {u.key} items {items}" for u, (_, items) in zip(measured, planned))
            self._last = (planned, build_request(measured, self.limits), label)
        _, request, label = self._last
        return PlannedStep(
            request=request,
            expected_hits=tuple(hits),
            prime=build_request(primes, self.limits) if primes else None,
            label=label,
            goal_ratio=target,
            handles=slots,
        )

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        """After the step: a failed one leaves its keys' server state unknown, so they are dropped.
        Returns the keys retired since the last call (never to be sent again)."""
        if not ok:
            for slot in step.handles:
                self._drop_key(slot)
        return self.retired.take()

    def reset(self) -> None:
        """The server lost its cache: every slot starts a fresh key at its next step."""
        for slot in self._slots:
            self._drop_key(slot)
        self.retired.extend(p.key for p in self._parked)
        self._parked = []

    def _drop_key(self, slot: _Slot) -> None:
        if slot.key is not None:
            self.retired.add(slot.key)
            slot.key = None

    # -- one slot -----------------------------------------------------------------------

    def _available(self, slot: _Slot, cap: int) -> int:
        return min(slot.history.events - self.candidates, cap)

    def _next_user(self, slot: _Slot) -> None:
        others = {s.user for s in self._slots if s is not slot}
        if slot.user >= 0:
            self.dealer.release(slot.user)
        slot.user = self.dealer.take(exclude=others)
        slot.history = SlotHistory.of(self.store, slot.user, self.limits.max_history + self.candidates)
        self._drop_key(slot)
        slot.sent = 0

    def _next_visit_end(self, slot: _Slot, after: int, cap: int) -> int:
        """End of the first visit that adds at least one event after `after` items."""
        bounds = slot.history.visit_starts
        i = bisect_right(bounds, after)
        end = bounds[i] if i < len(bounds) else slot.history.events
        return min(max(end, after + 1), self._available(slot, cap))

    # -- steering by tier -----------------------------------------------------------------

    def _steer(self, slot: _Slot, target: float, cap: int) -> float:
        """Put into `slot` a key that meets the next tier of the pattern; the ratio to plan it at."""
        model = self.steering.model
        self._parked = [p for p in self._parked if self._keep(p, cap)]
        tier = self._pattern.next()
        if tier is Tier.HOST:
            others = {s.user for s in self._slots if s is not slot}
            hosted = [p for p in self._parked if p.user not in others and model.where(p.key) is Tier.HOST
                      and self._grows(p, target, cap)]
            if hosted:  # the middle one by recency: as far from the GPU's reach as from the host's end
                self._swap(slot, hosted[len(hosted) // 2], cap)
                return target
        self._park(slot, cap)
        self._next_user(slot)
        # GPU: a fresh key primed to the ratio (the GPU holds the prime); its key then ages out of the GPU as
        # newer keys come in and serves a host hit later. A miss (or no key that only the host holds, which
        # the miss then makes): a fresh key sent cold.
        return target if tier is Tier.GPU else 0.0

    def _grows(self, entry: _Slot, target: float, cap: int) -> bool:
        held = self.steering.model.held(entry.key)
        return warm_items(target, held, entry.sent, self._available(entry, cap)) is not None

    def _keep(self, entry: _Slot, cap: int) -> bool:
        """A parked key stays while a pool holds it and it can grow; else it is retired."""
        if self.steering.model.where(entry.key) is Tier.MISS or entry.sent >= self._available(entry, cap):
            self.retired.add(entry.key)
            return False
        return True

    def _park(self, slot: _Slot, cap: int) -> None:
        if slot.key is not None and slot.sent < self._available(slot, cap):
            self._parked.append(replace(slot))
            slot.key = None
        self._drop_key(slot)

    def _swap(self, slot: _Slot, entry: _Slot, cap: int) -> None:
        if entry is slot:
            return
        self._parked.remove(entry)
        self._park(slot, cap)
        self.dealer.release(slot.user)
        slot.user, slot.key, slot.sent, slot.history = entry.user, entry.key, entry.sent, entry.history

    def _held(self, slot: _Slot) -> int:
        """Tokens the server holds for the slot's key: its whole history (one tier), or what the
        two-tier model says (a host copy may hold whole chunks only)."""
        if slot.key is None:
            return 0
        return history_tokens(slot.sent) if self.steering is None else self.steering.model.held(slot.key)

    def _plan_slot(self, slot: _Slot, target: float, cap: int) -> tuple[UserRequest | None, int, int]:
        """The slot's prime (if its key is fresh and needs one), its history length, its expected hits."""
        available = self._available(slot, cap)
        held = self._held(slot)
        items = warm_items(target, held, slot.sent, available) if slot.key is not None else None
        prime = None
        if items is None:
            if slot.sent >= available:
                self._next_user(slot)
                available = self._available(slot, cap)
            items = self._next_visit_end(slot, slot.sent, cap)
            self._drop_key(slot)
            slot.key = self.keys.new_key()
            prefix = prime_items(target, items)
            if prefix is not None:
                prime = self._user_request(slot, prefix, 1)
            held = history_tokens(prefix) if prefix is not None else 0
        slot.sent = items
        return prime, items, held

    def _user_request(self, slot: _Slot, items: int, candidates: int) -> UserRequest:
        return slot.history.request(items, candidates, slot.key)
