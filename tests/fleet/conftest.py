"""One fleet of two reference servers per test session, shared by every fleet test (a server's start
costs seconds); each test makes cache keys of its own. What a server counted is read from its
own metrics page here, with a pattern of the tests' own (not the package's parser)."""

from __future__ import annotations

import os
import re
import socket
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.fleet.gateway import find_haproxy
from hstu_replay.fleet.local import LocalFleet
from hstu_replay.request import UserRequest

FLEET_SERVERS = 2
FLEET_BUDGET_TOKENS = 200_000  # no test here comes near it: nothing is evicted
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


def tree(pid: int) -> set[int]:
    """`pid` and every process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo += parents.get(current, [])
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="session")
def fleet(compiled_repository, tmp_path_factory):
    """Two reference servers on CPU; at the end they are stopped and nothing of theirs may be left:
    no process of their trees (read from /proc before the stop) and no port they listened on."""
    fleet = LocalFleet(compiled_repository, FLEET_SERVERS, tmp_path_factory.mktemp("fleet"), FLEET_BUDGET_TOKENS,
                       ("--device", "cpu"), ready_timeout_s=240)
    fleet.start()
    yield fleet
    pids = set().union(*(tree(server.pid) for server in fleet.servers))
    ports = [port for server in fleet.servers for port in server.ports.all()]
    teardown = fleet.stop()
    assert teardown.clean, teardown.problems()
    assert [pid for pid in pids if alive(pid)] == []
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections closing there do not count
            sock.bind(("127.0.0.1", port))  # raises while something still listens there
