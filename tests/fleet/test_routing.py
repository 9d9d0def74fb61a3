"""The routers, key-hash against a ring written apart from its definition (tests/fleet/plain_ring.py)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.fleet.routing import POINTS_PER_SERVER, Routing, router, routing
from tests.fleet.plain_ring import POINTS, plain_ring

ADDRESSES = [f"127.0.0.1:{8001 + 10 * i}" for i in range(4)]
def keys(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(n)]


KEYS = keys(7, 400)


def test_key_hash_is_the_ring_of_its_definition():
    assert POINTS == POINTS_PER_SERVER
    ring, oracle = router(Routing.KEY_HASH, ADDRESSES), plain_ring(ADDRESSES)
    assert [ring.server(k) for k in KEYS] == [oracle(k) for k in KEYS]


def test_adding_a_server_moves_about_one_in_n_plus_one_keys_and_none_between_the_others():
    before = router(Routing.KEY_HASH, ADDRESSES[:3])
    after = router(Routing.KEY_HASH, ADDRESSES)
    moved = [(before.server(k), after.server(k)) for k in keys(3, 20000) if before.server(k) != after.server(k)]
    assert all(new == 3 for _, new in moved)  # a key moves only to the new server
    assert 0.15 < len(moved) / 20000 < 0.35  # about 1/4


def test_keys_spread_over_the_servers_within_a_fifth_of_the_mean():
    ring = router(Routing.KEY_HASH, ADDRESSES)
    counts = Counter(ring.server(k) for k in keys(5, 40000))
    assert set(counts) == {0, 1, 2, 3}
    assert max(abs(n - 10000) for n in counts.values()) < 2000, counts


def test_the_ring_depends_on_the_addresses_not_their_order():
    ring, reordered = router(Routing.KEY_HASH, ADDRESSES), router(Routing.KEY_HASH, ADDRESSES[::-1])
    assert [ADDRESSES[ring.server(k)] for k in KEYS] == [ADDRESSES[::-1][reordered.server(k)] for k in KEYS]


def test_round_robin_cycles_whatever_the_key():
    rr = router(Routing.ROUND_ROBIN, ADDRESSES[:3])
    assert [rr.server(k) for k in (5, 5, 5, 9, 9, 9, 1)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_uniform_and_seeded():
    draws = [router(Routing.RANDOM, ADDRESSES, seed=11).server(0) for _ in range(3)]
    assert len(set(draws)) == 1  # the same seed, the same first draw
    r = router(Routing.RANDOM, ADDRESSES, seed=11)
    counts = Counter(r.server(0) for _ in range(8000))
    assert max(abs(n - 2000) for n in counts.values()) < 300, counts


def test_only_key_hash_keeps_affinity():
    assert [r.keeps_affinity for r in Routing] == [True, False, False]


def test_a_routing_not_known_is_named():
    with pytest.raises(ConfigError, match="--routing 'sticky': use key-hash, round-robin, random"):
        routing("sticky")


def test_the_ring_routes_an_array_of_keys_as_it_routes_each():
    import numpy as np

    ring = router(Routing.KEY_HASH, ADDRESSES)
    many = keys(9, 5000) + [0, 1, 2**63 - 1]
    assert ring.servers(np.array(many, dtype=np.int64)).tolist() == [ring.server(k) for k in many]
