"""Which server of a fleet each request goes to (`--routing`): the registry `ROUTINGS`.

A request is routed by its first user's cache key. Under `key-hash` every key goes to one server
by a consistent hash, in every process of a run alike (the hash is a pure function of the key
and the addresses), so a user's history always meets the server that holds it; a virtual user
draws only keys that land on its own server (`plan.keys`), so a batch's users share a server.
`round-robin` and `random` are what a plain balancer does: they ignore the key.

`key-hash` is a consistent hash ring: each address owns `POINTS_PER_SERVER` points on a 64-bit
circle and a key goes to the owner of the first point at or after the key's own hash, so adding
a server to N moves about 1/(N+1) of the keys and no key moves between the servers that stay.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import itertools
import random
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from hstu_replay.errors import ConfigError

POINTS_PER_SERVER = 160  # ring points per address: the shares of the circle within a few percent
_MASK = (1 << 64) - 1


class Routing(enum.Enum):
    KEY_HASH = "key-hash"
    ROUND_ROBIN = "round-robin"
    RANDOM = "random"

    @property
    def keeps_affinity(self) -> bool:
        """Whether a key always reaches the same server (the client's plan then holds per server)."""
        return self is Routing.KEY_HASH


_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def mix64(value: int) -> int:
    """A 64-bit integer spread over the whole circle (SplitMix64's finaliser)."""
    z = (value + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * _M1) & _MASK
    z = ((z ^ (z >> 27)) * _M2) & _MASK
    return z ^ (z >> 31)


def mix64_array(values: np.ndarray) -> np.ndarray:
    """`mix64` of each of `values` (uint64 arithmetic wraps as the masks do)."""
    z = values.astype(np.uint64) + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _point(address: str, replica: int) -> int:
    digest = hashlib.blake2b(f"{address}#{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Router(Protocol):
    def server(self, key: int) -> int:
        """The index (in the fleet's order) of the server a request whose first key is `key` goes to."""


class HashRing:
    """`key-hash`: consistent hashing of cache keys onto the addresses."""

    def __init__(self, addresses: Sequence[str], seed: int = 0):
        points = sorted((_point(a, r), i) for i, a in enumerate(addresses) for r in range(POINTS_PER_SERVER))
        self._hashes = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self._hash_array = np.array(self._hashes, dtype=np.uint64)
        self._owner_array = np.array(self._owners + self._owners[:1], dtype=np.int64)  # past the last: the first

    def server(self, key: int) -> int:
        at = bisect.bisect_left(self._hashes, mix64(key))
        return self._owners[at % len(self._owners)]

    def servers(self, keys: np.ndarray) -> np.ndarray:
        """`server` of each of `keys`, at once."""
        return self._owner_array[np.searchsorted(self._hash_array, mix64_array(keys), side="left")]


class RoundRobin:
    """`round-robin`: each request to the next server, whatever its key."""

    def __init__(self, addresses: Sequence[str], seed: int = 0):
        self._next = itertools.cycle(range(len(addresses)))

    def server(self, key: int) -> int:
        return next(self._next)


class RandomChoice:
    """`random`: each request to a server drawn uniformly (seeded by --seed)."""

    def __init__(self, addresses: Sequence[str], seed: int = 0):
        self._rng = random.Random(seed)
        self._count = len(addresses)

    def server(self, key: int) -> int:
        return self._rng.randrange(self._count)


#: --routing -> the router it builds
ROUTINGS: dict[Routing, type] = {Routing.KEY_HASH: HashRing, Routing.ROUND_ROBIN: RoundRobin,
                                 Routing.RANDOM: RandomChoice}


def routing(name: str) -> Routing:
    try:
        return Routing(name)
    except ValueError:
        raise ConfigError(f"--routing {name!r}: use {', '.join(r.value for r in Routing)}") from None


def router(policy: Routing, addresses: Sequence[str], seed: int = 0) -> Router:
    return ROUTINGS[policy](addresses, seed)
