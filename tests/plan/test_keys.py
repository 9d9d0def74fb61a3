"""Cache keys: disjoint per virtual user, their route key, and keys drawn to land on a server."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.errors import PlanError
from hstu_replay.plan.keys import KeyAllocator, Landing, key_owner, route_key


def by_residue(n: int):
    """A plain 'server of each key' for the tests: the key modulo n."""
    return lambda keys: np.asarray(keys) % n


def test_keys_name_their_virtual_user_and_never_repeat():
    a, b = KeyAllocator(1, 7, nonce=3), KeyAllocator(2, 7, nonce=3)
    drawn = [a.new_key() for _ in range(100)] + [b.new_key() for _ in range(100)]
    assert len(set(drawn)) == 200
    assert {key_owner(k) for k in drawn[:100]} == {(1, 7)} and route_key(drawn[150]) == 2 * 4096 + 7
    assert a.route_key == 4096 + 7


def test_a_landing_user_gets_only_keys_of_its_server():
    keys = KeyAllocator(0, 3, nonce=1, landing=Landing(by_residue(5), home=2))
    drawn = [keys.new_key() for _ in range(3000)]
    assert all(k % 5 == 2 for k in drawn) and len(set(drawn)) == len(drawn)
    other = [keys.new_key(4) for _ in range(200)]  # a natural replay asks for another server's key
    assert all(k % 5 == 4 for k in other) and not set(other) & set(drawn)


def test_a_server_the_hash_never_gives_is_one_line():
    keys = KeyAllocator(0, 0, nonce=1, landing=Landing(lambda k: np.zeros(len(k), dtype=np.int64), home=1))
    with pytest.raises(PlanError, match="lands on server 1"):
        keys.new_key()
