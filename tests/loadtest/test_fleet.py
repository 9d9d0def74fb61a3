"""A run's fleet as one process holds it: homes, keys, models and routes, checked against the plain
ring of tests/fleet/plain_ring.py and hand-worked cache figures."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.fleet import Fleet
from hstu_replay.request import RequestTensors
from hstu_replay.stats.run_stats import RunStats
from tests.fleet.plain_ring import plain_ring

HOSTS = ("127.0.0.1:9001", "127.0.0.1:9011", "127.0.0.1:9021")


def fleet(tmp_path, workers: int = 1, **options) -> Fleet:
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path), **options)
    config = LoadTestConfig.from_options(parsed, host=",".join(HOSTS))
    return Fleet(config, workers, RunStats(), lambda _: None)


def request(keys, totals) -> RequestTensors:
    n = len(keys)
    return RequestTensors.of(np.zeros(sum(totals) + n, dtype=np.int64), np.ones(n, dtype=np.int64),
                             np.ones(n, dtype=np.int64), np.array(keys, dtype=np.int64), np.array(totals, dtype=np.int64))


def test_virtual_users_are_dealt_round_the_fleet_across_workers(tmp_path):
    f = fleet(tmp_path, workers=2)
    homes = Counter(f.home(worker, user, 2) for worker in range(2) for user in range(6))
    assert homes == {0: 4, 1: 4, 2: 4}


def test_a_virtual_users_keys_land_on_its_home_by_the_plain_ring(tmp_path):
    f, ring = fleet(tmp_path), plain_ring(HOSTS)
    for user in range(3):
        keys = f.keys(0, user, 1)
        drawn = [keys.new_key() for _ in range(20)]
        assert {ring(k) for k in drawn} == {f.home(0, user, 1)}
        assert f.route(request(drawn[:8], [10] * 8)).index == f.home(0, user, 1)


def test_under_key_hash_each_home_plans_with_its_own_servers_model(tmp_path):
    f = fleet(tmp_path, fleet_budgets="0,0,0")
    assert f.plan_cache is None
    assert [f.planning_cache(0, u, 1) is f.servers[u].cache for u in range(3)] == [True] * 3


def test_under_round_robin_the_plan_keeps_affinity_and_the_prediction_follows_the_request(tmp_path):
    f = fleet(tmp_path, routing="round-robin")
    assert f.home(0, 0, 1) is None and f.planning_cache(0, 0, 1) is f.plan_cache
    key, sent = 12345, []
    for total in (100, 150, 200, 250):  # one user returning four times, each visit to the next server
        server = f.route(request([key], [total]))
        sent.append((server.index, f.predict(server, request([key], [total])).hits[0]))
    # hand-worked: a visit hits only what its server saw of this user last time (nothing, the first round)
    assert sent == [(0, 0), (1, 0), (2, 0), (0, 100)]
    assert f.plan_cache.predict(request([key], [300])) == (250,)  # as one server would have it


def test_per_server_budgets_bound_each_model(tmp_path):
    f = fleet(tmp_path, fleet_budgets="64,128,0", cache_page_tokens=32)
    a, b = f.servers[0], f.servers[1]
    for s in (a, b):
        f.predict(s, request([1, 2], [64, 64]))
    # server 0 holds 64 tokens: of keys 1 and 2 only one stays; server 1 holds both
    assert sum(f.predict(a, request([1, 2], [64, 64])).hits) == 64
    assert sum(f.predict(b, request([1, 2], [64, 64])).hits) == 128


def test_one_address_is_the_single_server_run(tmp_path):
    parsed = argparse.Namespace(workload="dumps", dump_dir=str(tmp_path))
    one = Fleet(LoadTestConfig.from_options(parsed, host="grpc://127.0.0.1:9001"), 1, RunStats(), lambda _: None)
    assert not one.many and one.servers[0].index == -1 and one.home(0, 5, 1) is None
    assert one.route(request([7], [10])) is one.servers[0]
