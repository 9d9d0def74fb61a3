"""Cache keys (INPUT__3) that no two virtual users, workers or runs share.

A key is [run nonce: 20 bits][owner: 20 bits][counter: 23 bits]: owner = worker index x 4096
+ virtual-user index, so keys stay disjoint across Locust workers, and a new run against the
same server never meets a key an earlier run left cached.

In a fleet under `key-hash` each key goes to the server the hash gives it; a virtual user whose
requests go to one server (`Landing`) uses only keys that land there, drawn a block at a time
(about one key in N of a fleet of N lands): its batches share a server.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hstu_replay.errors import ConfigError, PlanError

_COUNTER_BITS = 23
_OWNER_BITS = 20
_NONCE_BITS = 20
MAX_USERS_PER_WORKER = 4096
DRAW_BLOCK = 1024  # candidate keys tried at once for those landing on a user's server
SPARE_KEYS = 64  # drawn keys kept for each other server, for a later request there (a natural replay's)
MAX_KEY_DRAWS = 64 * DRAW_BLOCK  # tried in a row without one landing: the fleet's hash gives that server nothing


@dataclass(frozen=True)
class Landing:
    """Where a virtual user's keys must land: `servers(keys)` names each key's server."""

    servers: Callable[[np.ndarray], np.ndarray]
    home: int


class KeyAllocator:
    def __init__(self, worker_index: int, user_index: int, nonce: int | None = None,
                 landing: Landing | None = None):
        if not 0 <= user_index < MAX_USERS_PER_WORKER:
            raise ConfigError(f"virtual user index {user_index}: at most {MAX_USERS_PER_WORKER} per worker")
        owner = worker_index * MAX_USERS_PER_WORKER + user_index
        if owner >= 1 << _OWNER_BITS:
            raise ConfigError(f"worker index {worker_index} too large for the cache-key layout")
        nonce = secrets.randbits(_NONCE_BITS) if nonce is None else nonce % (1 << _NONCE_BITS)
        self._base = ((nonce << _OWNER_BITS) | owner) << _COUNTER_BITS
        self._next = 0
        self._landing = landing  # which keys this user may use (None: every key)
        self._ready: dict[int, deque[int]] = {}  # server -> drawn keys that land there, not yet used

    @property
    def route_key(self) -> int:
        """The route key of every key this allocator makes (see `route_key`)."""
        return route_key(self._base)

    def new_key(self, server: int | None = None) -> int:
        """A key never made before; with a landing, one that lands on `server` (default: the home)."""
        if self._landing is None:
            return self._base + self._counted(1)
        server = self._landing.home if server is None else server
        ready = self._ready.setdefault(server, deque())
        drawn = 0
        while not ready:
            if drawn >= MAX_KEY_DRAWS:
                raise PlanError(f"no key of {MAX_KEY_DRAWS} drawn lands on server {server}")
            first = self._counted(DRAW_BLOCK)
            keys = np.arange(self._base + first, self._base + first + DRAW_BLOCK, dtype=np.int64)
            landed = self._landing.servers(keys)
            for where in np.unique(landed).tolist():  # every server asked for keeps a few spare draws
                queue = self._ready.setdefault(where, deque())
                if where == server or len(queue) < SPARE_KEYS:
                    queue.extend(keys[landed == where].tolist()[:None if where == server else SPARE_KEYS])
            drawn += DRAW_BLOCK
        return ready.popleft()

    def _counted(self, count: int) -> int:
        """The first of the next `count` counter values."""
        if self._next + count >= 1 << _COUNTER_BITS:
            raise ConfigError("this virtual user ran out of cache keys; shorten the run")
        first = self._next + 1
        self._next += count
        return first


def route_key(key: int) -> int:
    """The number of the virtual user that made `key` (worker index x 4096 + its index): what the
    routing header carries, the same for every key that user makes, in every run, so that a
    gateway hashing on it keeps a user's batches on one server."""
    return (key >> _COUNTER_BITS) & ((1 << _OWNER_BITS) - 1)


def key_owner(key: int) -> tuple[int, int]:
    """(worker index, virtual-user index) of the user that made `key` (what a server's log of keys
    says of who sent each request)."""
    return divmod(route_key(key), MAX_USERS_PER_WORKER)
