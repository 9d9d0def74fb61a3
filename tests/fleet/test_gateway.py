"""HAProxy in front of a fleet: the configuration (checked by haproxy itself), how it spreads route
keys, and, in front of real reference servers, where each request went by what each server counted.

The cache oracle here is a plain per-server bookkeeping: a server holds, per key, the history
tokens of the last visit it served; a visit reuses min(held, its own tokens) there."""

from __future__ import annotations

import collections
import http.client
import http.server
import socket
import subprocess
import threading

import pytest

from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.fleet.gateway import (
    DEFAULT_ROUTING_HEADER, Balance, GatewayPorts, GatewaySpec, backend_spec, config_text, gateway_for, haproxy_binary,
)
from hstu_replay.fleet.local import Backend
from hstu_replay.interface import history_tokens
from hstu_replay.plan.keys import KeyAllocator, route_key
from hstu_replay.process import free_ports
from hstu_replay.request import build_request
from tests.fleet.conftest import history_user, needs_haproxy, served_requests

TWO = (Backend("127.0.0.1:9001", "127.0.0.1:9000"), Backend("127.0.0.1:9011", "127.0.0.1:9010"))


def spec(balance: Balance = Balance.HASH, backends=TWO, header: str = DEFAULT_ROUTING_HEADER) -> GatewaySpec:
    return GatewaySpec(tuple(backends), balance, header, GatewayPorts(7001, 7000))


# -- the configuration -------------------------------------------------------------------------

def test_hash_config_balances_by_the_header_on_a_consistent_tree():
    text = config_text(spec(header="X-Hstu-Route"))
    backends = text.split("\nbackend ")[1:]
    assert len(backends) == 2
    for section in backends:
        assert "    balance hdr(x-hstu-route)\n" in section
        assert "    hash-type consistent sdbm avalanche\n" in section
    assert "    bind 127.0.0.1:7001 proto h2\n" in text and "    bind 127.0.0.1:7000\n" in text
    assert "server s0 127.0.0.1:9001 id 1 weight 64 check proto h2\n" in text
    assert "server s1 127.0.0.1:9010 id 2 weight 64 check\n" in text
    assert "roundrobin" not in text


def test_round_robin_config_ignores_the_header():
    text = config_text(spec(Balance.ROUND_ROBIN))
    assert text.count("    balance roundrobin\n") == 2
    assert "hdr(" not in text and "hash-type" not in text


@needs_haproxy
@pytest.mark.parametrize("balance", list(Balance))
def test_haproxy_accepts_the_config(tmp_path, balance):
    path = tmp_path / "haproxy.cfg"
    path.write_text(config_text(spec(balance)))
    checked = subprocess.run([haproxy_binary(), "-c", "-f", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("backends, header, message", [
    ((TWO[0], TWO[0]), DEFAULT_ROUTING_HEADER, "address 127.0.0.1:9001 given twice"),
    ((TWO[0], Backend("127.0.0.1:9000", "127.0.0.1:9020")), DEFAULT_ROUTING_HEADER, "127.0.0.1:9000 given twice"),
    (TWO, "x route", "--routing-header 'x route'"),
    (TWO, "x:route", "--routing-header 'x:route'"),
    (TWO, "", "--routing-header ''"),
    ((), DEFAULT_ROUTING_HEADER, "at least one backend"),
])
def test_bad_specs_are_one_line(backends, header, message):
    with pytest.raises(ConfigError, match=message):
        spec(backends=backends, header=header)


@pytest.mark.parametrize("text", ["grpc=a:1", "grpc=a:1,http=a:2,grpc=b:3", "grpc=a:1,http=a", "grpc=:1,http=a:2",
                                  "grpc=a:0,http=a:2", "grpc=a:1,web=a:2", "grpc=a b:1,http=a:2"])
def test_bad_backend_specs_are_refused(text):
    with pytest.raises(ConfigError, match="--backend"):
        backend_spec(text)


def test_a_backend_spec_names_both_addresses():
    assert backend_spec("http=h2.example:8000,grpc=h1.example:8001") == Backend("h1.example:8001", "h2.example:8000")


# -- the spread, in front of do-nothing HTTP backends ------------------------------------------

class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_GET(self):
        body = str(self.server.index).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the gateway's connections reset at its stop


def backends_answering_their_index(count: int) -> list[_Quiet]:
    servers = []
    for index in range(count):
        server = _Quiet(("127.0.0.1", 0), _Answer)
        server.index = index
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    return servers


def where_each_key_went(tmp_path, balance: Balance, servers: int, keys: list[int]) -> list[int]:
    """The backend that answered each route key, sent in turn through a gateway of `balance`."""
    answering = backends_answering_their_index(servers)
    backends = [Backend(f"127.0.0.1:{grpc}", f"127.0.0.1:{s.server_address[1]}")
                for s, grpc in zip(answering, free_ports(servers))]  # gRPC: nothing there, unused here
    try:
        with gateway_for(backends, tmp_path, balance) as gateway:
            connection = http.client.HTTPConnection("127.0.0.1", gateway.spec.ports.http, timeout=10)
            went = []
            for key in keys:
                connection.request("GET", "/", headers={DEFAULT_ROUTING_HEADER: str(key)})
                went.append(int(connection.getresponse().read()))
            connection.close()
            teardown = gateway.stop()
        assert teardown.clean, teardown.left
    finally:
        for server in answering:
            server.shutdown()
            server.server_close()
    return went


#: route keys as four Locust workers of 256 virtual users make them
WORKER_KEYS = [route_key(KeyAllocator(worker, user, nonce=0).new_key()) for worker in range(4) for user in range(256)]


@needs_haproxy
@pytest.mark.parametrize("servers", [2, 4])
def test_hashing_spreads_small_decimal_keys_evenly_and_keeps_them(tmp_path, servers):
    went = where_each_key_went(tmp_path, Balance.HASH, servers, WORKER_KEYS + WORKER_KEYS[:64])
    assert went[len(WORKER_KEYS):] == went[:64]  # a key sent again goes where it went
    shares = collections.Counter(went[:len(WORKER_KEYS)])
    for server in range(servers):  # measured: 0.49-0.51 of 1,024 keys over 2, 0.24-0.27 over 4
        assert abs(shares[server] / len(WORKER_KEYS) - 1 / servers) < 0.05, shares


@needs_haproxy
def test_round_robin_takes_turns_whatever_the_key(tmp_path):
    went = where_each_key_went(tmp_path, Balance.ROUND_ROBIN, 3, [5] * 12)
    assert sorted(collections.Counter(went).values()) == [4, 4, 4]
    assert all(went[i] != went[i + 1] for i in range(len(went) - 1))


# -- in front of the real fleet ----------------------------------------------------------------

def oracle_hits(visits, servers) -> list[int]:
    """Tokens each visit reuses, given where each went: per server, what each key last left there."""
    held: dict[tuple[int, int], int] = {}
    hits = []
    for (key, items), server in zip(visits, servers):
        tokens = history_tokens(items)
        hits.append(min(held.get((server, key), 0), tokens))
        held[server, key] = tokens
    return hits


def replay(fleet, gateway, protocol: str, users, visits_each: int):
    """Visits (cache key, history items) in turns (every user's first visit, then every second one...),
    each sent through `gateway` with its route key; the server that counted it and the hits it answered."""
    keys = [allocator.new_key() for allocator in users]
    visits = [(key, 10 * (turn + 1)) for turn in range(visits_each) for key in keys]
    client = TritonClient(ClientOptions(url=gateway.url_for(protocol), protocol=protocol,
                                        route_header=DEFAULT_ROUTING_HEADER))
    servers, hits = [], []
    try:
        client.connect()
        for key, items in visits:
            before = served_requests(fleet)
            answer = client.infer(build_request([history_user(key % 1000, items, key)]), route_key=route_key(key))
            moved = [i for i, (a, b) in enumerate(zip(served_requests(fleet), before)) if a != b]
            assert len(moved) == 1, f"{len(moved)} servers counted one request"
            servers.append(moved[0])
            hits.append(int(answer.cached_tokens[0]))
    finally:
        client.close()
    return visits, servers, hits


def token_ratio(visits, hits) -> float:
    return sum(hits) / sum(history_tokens(items) for _, items in visits)


@pytest.fixture(scope="module")
def gateways(fleet, tmp_path_factory):
    started = {balance: gateway_for(fleet.backends, tmp_path_factory.mktemp(balance.value), balance).launch()
               for balance in Balance}
    yield started
    left = {balance.value: teardown.left for balance, g in started.items() if not (teardown := g.stop()).clean}
    assert not left


@needs_haproxy
@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_hashing_keeps_each_route_key_on_one_server_and_its_history_hits(fleet, gateways, protocol):
    nonce = 11 if protocol == "grpc" else 12
    users = [KeyAllocator(worker, user, nonce) for worker in range(2) for user in range(8)]
    visits, servers, hits = replay(fleet, gateways[Balance.HASH], protocol, users, 3)
    where = collections.defaultdict(set)
    for (key, _), server in zip(visits, servers):
        where[route_key(key)].add(server)
    assert all(len(s) == 1 for s in where.values()), dict(where)  # every visit of a key to one server
    assert set().union(*where.values()) == {0, 1}  # and the keys spread over both
    assert hits == oracle_hits(visits, servers)
    assert hits[len(users):] == [history_tokens(items - 10) for _, items in visits[len(users):]]  # each revisit hit all


@needs_haproxy
@pytest.mark.integration
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_round_robin_sends_a_returning_user_elsewhere_and_it_misses(fleet, gateways, protocol):
    nonce = 21 if protocol == "grpc" else 22
    users = [KeyAllocator(0, user, nonce) for user in range(7)]  # odd: a user's next turn is on the other server
    visits, servers, hits = replay(fleet, gateways[Balance.ROUND_ROBIN], protocol, users, 3)
    assert all(servers[i] != servers[i + 1] for i in range(len(servers) - 1))  # turns, whatever the key
    expected = oracle_hits(visits, servers)
    assert hits == expected
    affinity = oracle_hits(visits, [0] * len(visits))  # what one server per key would have reused
    assert token_ratio(visits, hits) < 0.5 * token_ratio(visits, affinity)
    assert hits[len(users):2 * len(users)] == [0] * len(users)  # the second visit: on the other server, a miss


@needs_haproxy
def test_a_gateway_that_cannot_bind_says_why(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = GatewayPorts(taken.getsockname()[1], free_ports(1)[0])
        gateway = gateway_for(TWO, tmp_path, Balance.HASH, ports=ports)
        try:
            with pytest.raises(ServerError, match=r"^the gateway did not start: \[ALERT\].*cannot bind socket"):
                gateway.launch()
        finally:
            assert gateway.stop().clean


def gateway_run(tmp_path, fleet, gateway, sample_store, ratios: str, protocol: str = "grpc"):
    from tests.conftest import run_locust

    metrics = ",".join(b.cache_metrics_url for b in fleet.backends)
    result = run_locust(tmp_path, "-u", "6", "-r", "6", "--host", gateway.url_for(protocol), "--triton-protocol",
                        protocol, "--routing-header", DEFAULT_ROUTING_HEADER, "--fleet-metrics", metrics,
                        "--workload", "sessions", "--store", str(sample_store), "--hit-ratios", ratios,
                        "--batch-sizes", "8", "--stage-seconds", "3", "--warmup-seconds", "0.5",
                        "--max-history", "256", "--verify-fraction", "0")
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return result


@needs_haproxy
@pytest.mark.integration
def test_a_load_test_through_the_hashing_gateway_holds_the_ratio_on_every_server(fleet, gateways, sample_store,
                                                                                 tmp_path):
    before = served_requests(fleet)
    # one stage that needs no priming requests: a server's own counters cover all it computed in the
    # window, and a window's edges are polled (the next stage's first requests may fall inside it)
    result = gateway_run(tmp_path, fleet, gateways[Balance.HASH], sample_store, "1.0")
    report = result.report
    assert report["fleet"]["routing"] == "gateway"
    # each row named by the server's gRPC address, as its own page says it (not by the page's URL)
    assert report["fleet"]["servers"] == [b.grpc for b in fleet.backends]
    for stage, bin_ in zip(report["fleet"]["stages"], report["bins"]):
        rows = stage["servers"]
        assert all(r["requests"] > 0 for r in rows), rows  # the route keys spread over both servers
        for r in rows:  # each server's own counters: the target held on each
            assert abs(r["observed_ratio"] - stage["target_ratio"]) < 0.03, (stage["name"], r)
        assert bin_["achieved_ratio"] == pytest.approx(stage["target_ratio"], abs=0.03)
    assert sum(served_requests(fleet)) - sum(before) >= sum(r["requests"] for s in report["fleet"]["stages"]
                                                           for r in s["servers"])
    assert "each server's own counters" in result.stdout


@needs_haproxy
@pytest.mark.integration
def test_a_load_test_through_round_robin_loses_the_ratio_the_client_planned(fleet, gateways, sample_store, tmp_path):
    report = gateway_run(tmp_path, fleet, gateways[Balance.ROUND_ROBIN], sample_store, "0.5,1.0").report
    (half, whole) = report["stages"]
    # the client planned and predicted as one server holds them; the servers behind the balancer found less
    assert half["predicted_ratio"] == pytest.approx(0.5, abs=0.03) and whole["predicted_ratio"] == 1.0
    assert half["observed_ratio"] < 0.4 and half["hits_lost"] > 0
    for stage in report["fleet"]["stages"]:
        assert all(0.3 <= r["share"] <= 0.7 for r in stage["servers"])  # turns, whatever the key
        assert max(r["observed_ratio"] for r in stage["servers"]) < stage["target_ratio"] - 0.05 or \
            stage["target_ratio"] == 1.0
