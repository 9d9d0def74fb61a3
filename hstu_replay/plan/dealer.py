"""Hands out workload users (store users, dumped users) to the batch slots of one process.

One dealer per process, shared by its virtual users: it walks one shuffled order, so slots and
virtual users replay different users instead of the same order shifted by one. A user is held
by one slot at a time while enough users are free; a request never carries one user twice.
Workers start at evenly spaced points of the same order.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from hstu_replay.errors import ConfigError, PlanError


class Dealer:
    """`identities[item]` names the user behind an item (a store user may be dumped several
    times); a request is kept free of repeated identities. Default: the item itself."""

    def __init__(self, items: Sequence[int], seed: int = 0, worker_index: int = 0, worker_count: int = 1,
                 identities: Sequence[int] | None = None):
        if not items:
            raise ConfigError("no users to replay")
        self.identities = identities
        order = list(items)
        random.Random(seed).shuffle(order)
        start = (worker_index % max(worker_count, 1)) * len(order) // max(worker_count, 1)
        self.order = order[start:] + order[:start]
        self._next = 0
        self._held: dict[int, int] = {}  # item -> slots holding it

    def __len__(self) -> int:
        return len(self.order)

    def identity(self, item: int) -> int:
        return item if self.identities is None else self.identities[item]

    def take(self, exclude: Collection[int] = ()) -> int:
        """The next item in the order that no slot holds and whose identity `exclude` (the rest
        of the request) lacks; failing that, one only `exclude` rules out. Bounded: one pass each."""
        for allow_held in (False, True):
            for _ in range(len(self.order)):
                item = self.order[self._next % len(self.order)]
                self._next += 1
                if self.identity(item) in exclude or (not allow_held and self._held.get(item)):
                    continue
                self._held[item] = self._held.get(item, 0) + 1
                return item
        raise PlanError(f"{len(self.order)} users cannot fill a batch of {len(exclude) + 1} distinct users")

    def holders(self, item: int) -> int:
        return self._held.get(item, 0)

    def release(self, item: int) -> None:
        count = self._held.get(item, 0) - 1
        if count > 0:
            self._held[item] = count
        else:
            self._held.pop(item, None)
