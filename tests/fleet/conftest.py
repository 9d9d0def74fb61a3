"""What a server of the session's fleet (tests/conftest.py `fleet`) counted, read from its own metrics
page with a pattern of the tests' own (not the package's parser), and the users sent to it."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

from hstu_replay.fleet.gateway import find_haproxy
from hstu_replay.fleet.local import LocalFleet
from hstu_replay.process import port_free
from hstu_replay.request import UserRequest

needs_haproxy = pytest.mark.skipif(find_haproxy() is None,
                                   reason="haproxy is not installed (scripts/test.sh installs Debian's package)")


def counter(url: str, name: str) -> float:
    """The value of counter `name` (a sample without labels) on the Prometheus page at `url`."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"{name} not on {url}"
    return float(found.group(1))


def served_requests(fleet: LocalFleet) -> list[float]:
    """Each server's KV-cache request counter."""
    return [counter(b.cache_metrics_url, "hstu_kvcache_requests_total") for b in fleet.backends]


def history_user(seed: int, items: int, key: int) -> UserRequest:
    """A user with `items` history items (the first `items` of its seed's own sequence) on cache key `key`."""
    rng = np.random.default_rng(seed)
    return UserRequest(seed, (1, 2, 3, 1, 2), rng.integers(1, 10**7, 64)[:items], rng.integers(0, 256, 64)[:items],
                       rng.integers(1, 10**7, 4), key)


def free_base(width: int) -> int:
    """The first of `width` consecutive ports free on loopback now (searched from 20000 up)."""
    for base in range(20000, 60000, 97):
        if all(port_free(port) for port in range(base, base + width)):
            return base
    raise AssertionError("no run of free ports on loopback")
