"""A working set of N keys revisited round-robin at a fixed history length (`--working-set N`).

Each virtual user owns N cache keys, each one store user at the same history length, and sends
them in a cycle: entry 0, 1, ..., N-1, 0, 1, ... (a batch of B takes the next B; N is a multiple
of every batch size, so a batch always holds the same entries and, with at least B users in the
store, distinct users). The first visit of a key is sent cold; every later visit sends the same
history again, a full hit wherever a pool still holds it. In a cyclic order every LRU pool sees a
reuse distance of N keys, so with T tokens per key (in whole pages) the keys are all GPU hits
while N*T fits the GPU budget, host hits while N*T fits the host pool (`flexkv`: the host holds
copies of the GPU's users too), and misses beyond: sweeping N past each budget shows the knees.
What each visit is expected to find is what the process's two-tier model holds for its key.
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits, history_tokens
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.retired import RetiredKeys
from hstu_replay.plan.sessions import SlotHistory
from hstu_replay.plan.step import PlannedStep
from hstu_replay.request import build_request


@dataclass
class WorkingSetEntry:
    history: SlotHistory
    key: int | None = None  # None: not sent yet (or its server state is unknown): a fresh key, sent cold


def working_set_plan(store, size: int, batch_sizes: tuple[int, ...], limits: Limits, candidates: int,
                     order: list[int]) -> tuple[int, list[int]]:
    """(history items every entry sends, the store users of the entries), checked: one line naming
    what is wrong otherwise. `order` is the process's user order (the dealer's)."""
    largest = max(batch_sizes)
    items = min(limits.history_cap(b, candidates) for b in batch_sizes)
    if size < 1:
        raise ConfigError(f"--working-set {size}: give a number of keys, 1 or more")
    uneven = [b for b in batch_sizes if size % b]
    if uneven:
        raise ConfigError(f"--working-set {size}: make it a multiple of every batch size ({uneven} do not divide it), "
                          "so every batch holds the same keys")
    users = [u for u in order if len(store.user(u).video_ids) >= items + candidates]
    if len(users) < largest:
        raise ConfigError(f"--working-set {size}: {len(users)} store users have {items} history items and "
                          f"{candidates} candidates, a batch of {largest} needs as many (lower --max-history)")
    return items, [users[i % len(users)] for i in range(size)]


class WorkingSetSource:
    """One virtual user's cycle over its N keys."""

    def __init__(self, store, users: list[int], items: int, keys: KeyAllocator, candidates: int, limits: Limits,
                 cache=None):
        self.keys, self.candidates, self.limits, self.cache = keys, candidates, limits, cache
        self.items = items
        self.entries = [WorkingSetEntry(SlotHistory.of(store, u, items + candidates)) for u in users]
        self._next = 0
        self.retired = RetiredKeys()

    @property
    def exhausted(self) -> bool:
        return False

    def next_step(self, target: float, batch_size: int) -> PlannedStep:
        start = self._next
        self._next = (start + batch_size) % len(self.entries)
        chosen = tuple(self.entries[start : start + batch_size])
        hits = tuple(self._expected(entry) for entry in chosen)
        for entry in chosen:
            if entry.key is None:
                entry.key = self.keys.new_key()
        users = [entry.history.request(self.items, self.candidates, entry.key) for entry in chosen]
        label = "; ".join(f"user {u.user_id} key {u.key} items {self.items}" for u in users)
        return PlannedStep(request=build_request(users, self.limits), expected_hits=hits, prime=None, label=label,
                           goal_ratio=target, handles=chosen)

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        if not ok:
            for entry in step.handles:
                self._drop(entry)
        return self.retired.take()

    def reset(self) -> None:
        for entry in self.entries:
            self._drop(entry)

    def _drop(self, entry: WorkingSetEntry) -> None:
        if entry.key is not None:
            self.retired.add(entry.key)
            entry.key = None

    def _expected(self, entry: WorkingSetEntry) -> int:
        tokens = history_tokens(self.items)
        if entry.key is None:
            return 0
        return tokens if self.cache is None else min(self.cache.held(entry.key), tokens)
