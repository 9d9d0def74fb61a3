"""`hstu-replay fleet serve|gateway-config`: a fleet of reference servers on loopback (with HAProxy in
front), and the HAProxy configuration for an operator's own servers.

Every option is read as text and checked here, before anything starts: a bad one is one line, exit 2.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

from hstu_replay.arguments import DEVICE, REPOSITORY, SERVE_ARGS, Option, number, split_args
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.interface import DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT
from hstu_replay.process import long_running

WATCH_PERIOD_S = 0.5  # how often a serving fleet is looked at
SERVERS = Option("--servers", "reference servers to start, each on ports of its own", 2)
CACHE_BUDGET = Option("--cache-budget-tokens", "each server's KV-cache capacity in tokens (default: the server's own)")
ROUTING_HEADER = Option("--routing-header", "the header carrying each request's route key, hashed by the gateway")
GATEWAY = Option("--gateway", "HAProxy in front of the fleet: hash (consistent hashing of --routing-header) or "
                 "round-robin (none: the servers alone)")
BALANCE = Option("--balance", "hash (consistent hashing of --routing-header) or round-robin", "hash")


def add_commands(groups) -> None:
    from hstu_replay.fleet.gateway import DEFAULT_ROUTING_HEADER

    fleet = groups.add_parser("fleet", help="several reference servers on loopback, and a gateway (HAProxy) in front",
                              epilog="example: hstu-replay fleet serve --servers 2 --repository runs/model_repository "
                                     "--gateway hash")
    commands = fleet.add_subparsers(dest="fleet_command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="start N reference servers (and a gateway) until Ctrl-C or SIGTERM",
                                description="Start N reference servers on loopback, each with its own KV cache, "
                                            "optionally HAProxy in front; print every address; serve until "
                                            "Ctrl-C or SIGTERM, then stop everything.",
                                epilog="example: hstu-replay fleet serve --servers 2 --repository "
                                       "runs/model_repository --cache-budget-tokens 65536 --gateway hash "
                                       "--routing-header x-hstu-route")
    SERVERS.add_to(serve, text=True)
    REPOSITORY.add_to(serve)
    CACHE_BUDGET.add_to(serve)
    DEVICE.add_to(serve)
    SERVE_ARGS.add_to(serve, help='more `server serve` arguments for every server, e.g. --serve-args="--threads 1"')
    GATEWAY.add_to(serve)
    ROUTING_HEADER.add_to(serve, default=DEFAULT_ROUTING_HEADER)
    Option("--gateway-grpc-port", "the gateway's gRPC port (default 0: a free one)", 0).add_to(serve, text=True)
    Option("--gateway-http-port", "the gateway's HTTP port (default 0: a free one)", 0).add_to(serve, text=True)
    Option("--base-port", "pin the servers' ports: server i takes the four from BASE + 4 i on (HTTP, gRPC, "
           f"metrics, cache metrics; {DEFAULT_HTTP_PORT} gives server 0 `server serve`'s own); default 0: free ports",
           0).add_to(serve, text=True)
    Option("--log-dir", "the servers' logs and the gateway's configuration and log", "runs/fleet").add_to(serve)
    serve.set_defaults(func=_serve)

    config = commands.add_parser("gateway-config", help="print the HAProxy configuration for your own servers",
                                 epilog="example: hstu-replay fleet gateway-config --backend grpc=10.0.0.1:8001,"
                                        "http=10.0.0.1:8000 --backend grpc=10.0.0.2:8001,http=10.0.0.2:8000 "
                                        "--balance hash --routing-header x-hstu-route")
    Option("--backend", "one server's addresses, grpc=HOST:PORT,http=HOST:PORT; once per server").add_to(
        config, action="append", default=[])
    BALANCE.add_to(config)
    ROUTING_HEADER.add_to(config, default=DEFAULT_ROUTING_HEADER)
    Option("--grpc-port", "the gateway's gRPC port", DEFAULT_GRPC_PORT).add_to(config, text=True)
    Option("--http-port", "the gateway's HTTP port", DEFAULT_HTTP_PORT).add_to(config, text=True)
    config.set_defaults(func=_gateway_config)


def _port(flag: str, text: str, low: int = 1) -> int:
    from hstu_replay.process import PORT_MAX

    return number(flag, text, low, PORT_MAX, integral=True)


def _gateway_config(args) -> int:
    from hstu_replay.fleet.gateway import GatewayPorts, GatewaySpec, backend_spec, balance, config_text

    if not args.backend:
        raise ConfigError("--backend: give one per server (grpc=HOST:PORT,http=HOST:PORT)")
    spec = GatewaySpec(tuple(backend_spec(text) for text in args.backend), balance(args.balance), args.routing_header,
                       GatewayPorts(_port("--grpc-port", args.grpc_port), _port("--http-port", args.http_port)))
    sys.stdout.write(config_text(spec))
    return 0


@long_running
def _serve(args) -> int:
    from hstu_replay.fleet.gateway import Balance, GatewayPorts, balance, gateway_for, haproxy_binary, routing_header
    from hstu_replay.fleet.local import LocalFleet

    servers = number("--servers", args.servers, 1, integral=True)
    budget = None if args.cache_budget_tokens is None else number("--cache-budget-tokens", args.cache_budget_tokens,
                                                                    0, integral=True)
    policy = None if args.gateway is None else balance(args.gateway, "--gateway")
    header = routing_header(args.routing_header)
    ports = (_port("--gateway-grpc-port", args.gateway_grpc_port, 0),
             _port("--gateway-http-port", args.gateway_http_port, 0))
    base_port = _port("--base-port", args.base_port, 0)
    serve_args = ("--device", args.device, *split_args("--serve-args", args.serve_args))
    if policy is not None:
        haproxy_binary()  # a missing HAProxy is said before the servers start
    log_dir = Path(args.log_dir)
    fleet = LocalFleet(args.repository, servers, log_dir, budget, serve_args, base_port=base_port)
    gateway = None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        with fleet:
            for i, backend in enumerate(fleet.backends):
                print(f"server {i}: grpc {backend.grpc}  http {backend.http}  metrics {backend.metrics_url}  "
                      f"cache metrics {backend.cache_metrics_url}", flush=True)
            if policy is not None:
                gateway = gateway_for(fleet.backends, log_dir / "gateway", policy, header, GatewayPorts.free(*ports))
            with gateway if gateway is not None else nullcontext():
                if gateway is not None:
                    by = f" by {header}" if policy is Balance.HASH else ""
                    print(f"gateway ({policy.value}{by}): grpc {gateway.grpc_url}  http {gateway.http_url}  "
                          f"config {gateway.config}", flush=True)
                print("hstu-replay: serving; Ctrl-C or SIGTERM stops the fleet", file=sys.stderr, flush=True)
                while not stop.wait(WATCH_PERIOD_S):
                    failed = fleet.failure() or (gateway.failure() if gateway is not None else None)
                    if failed is not None:
                        raise ServerError(failed)
    except KeyboardInterrupt:
        pass  # the fleet and the gateway were stopped on the way out
    finally:
        signal.signal(signal.SIGTERM, previous)
    left = fleet.stop().problems()
    if gateway is not None and not (teardown := gateway.stop()).clean:
        left.append(f"gateway: {', '.join(f'{l} left' for l in teardown.left)}")
    if left:
        raise ServerError(f"the fleet did not stop cleanly: {'; '.join(left)}")
    print("hstu-replay: fleet stopped", file=sys.stderr, flush=True)
    return 0
