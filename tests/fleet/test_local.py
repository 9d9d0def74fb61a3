"""A local fleet: servers on ports of their own, each answering with its own KV cache and budget."""

from __future__ import annotations

import socket

import pytest

from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.fleet.local import LocalFleet, fleet_ports
from hstu_replay.interface import history_tokens
from hstu_replay.process import Ports
from hstu_replay.request import build_request
from tests.conftest import FLEET_BUDGET_TOKENS, FLEET_SERVERS
from tests.fleet.conftest import free_base, history_user, served_requests


def test_fleet_ports_are_all_distinct():
    ports = [port for p in fleet_ports(8) for port in p.all()]
    assert len(ports) == len(set(ports)) == 8 * 4


def test_pinned_ports_follow_server_serves_order():
    base = free_base(12)
    assert fleet_ports(3, base) == [Ports(http=base + 4 * i, grpc=base + 4 * i + 1, metrics=base + 4 * i + 2,
                                          cache_metrics=base + 4 * i + 3) for i in range(3)]


def test_a_pinned_port_taken_is_named():
    base = free_base(8)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 5))
        taken.listen()
        with pytest.raises(ConfigError, match=rf"^--base-port {base}: port {base + 5} is taken on 127.0.0.1 "
                                              rf"\(the fleet needs {base}-{base + 7}\)$"):
            fleet_ports(2, base)
    with pytest.raises(ConfigError, match="servers need ports up to 65536, past 65535"):
        fleet_ports(1, 65536 - 3)


@pytest.mark.parametrize("count", [0, -1])
def test_a_fleet_needs_a_server(tmp_path, count):
    with pytest.raises(ConfigError, match="at least 1 server"):
        LocalFleet(tmp_path, count, tmp_path)


@pytest.mark.integration
def test_each_server_answers_with_its_own_cache_and_budget(fleet):
    backends = fleet.backends
    assert len(backends) == FLEET_SERVERS
    addresses = [a for b in backends for a in (b.grpc, b.http, b.metrics_url, b.cache_metrics_url)]
    assert len(set(addresses)) == len(addresses)
    before = served_requests(fleet)
    for n, protocol in enumerate(("grpc", "http")):
        key = 7_000_000 + n  # the same key on every server: each cache is its own
        for backend in backends:
            client = TritonClient(ClientOptions(url=backend.address(protocol), protocol=protocol))
            try:
                budgets = client.server_budgets()
                assert budgets is not None and budgets.gpu_tokens == FLEET_BUDGET_TOKENS
                first = client.infer(build_request([history_user(1, 10, key)]))
                again = client.infer(build_request([history_user(1, 20, key)]))
            finally:
                client.close()
            assert first.cached_tokens.tolist() == [0]
            assert again.cached_tokens.tolist() == [history_tokens(10)]
    assert [a - b for a, b in zip(served_requests(fleet), before)] == [4] * FLEET_SERVERS


@pytest.mark.integration
def test_a_server_that_cannot_start_is_named_and_the_fleet_stopped(tmp_path):
    fleet = LocalFleet(tmp_path, 2, tmp_path / "logs", serve_args=("--device", "cpu", "--threads", "-1"))
    try:
        with pytest.raises(ServerError, match=r"^server 0 of the fleet: the server exited \(exit 2\) while "
                                              r"starting: hstu-replay: error: --threads -1"):
            fleet.start()
        assert not any(server.running for server in fleet.servers)
    finally:
        assert fleet.stop().clean
