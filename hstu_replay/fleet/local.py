"""A fleet of reference servers on loopback (`LocalFleet`): N `server serve` children, one lifecycle.

Each server is the reference target (`hstu-replay server serve`) on ports of its own (gRPC, HTTP,
Triton's metrics, the KV-cache counters), each with its own KV cache of the given budget. They
are started together (the slow part, loading the model, overlaps), awaited ready one after
another, and stopped together; the teardown of each is checked (`process.Child`): nothing it
started may outlive it, no port it listened on may stay taken.

What a gateway and the per-server figures need of each server is a `Backend`: its gRPC and HTTP
addresses and its metrics URLs.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.process import HOST, PORT_MAX, Ports, ServerProcess, StartFailed, Teardown, free_ports, port_free


@dataclass(frozen=True)
class Backend:
    """One server of a fleet as a gateway and the metrics scrapers see it."""

    grpc: str  # host:port
    http: str  # host:port
    metrics_url: str | None = None  # Triton's Prometheus page
    cache_metrics_url: str | None = None  # the KV-cache counters' page

    def address(self, protocol: str) -> str:
        return self.grpc if protocol == "grpc" else self.http


def backend_of(server: ServerProcess) -> Backend:
    """The addresses of a reference server started on loopback."""
    ports = server.ports
    cache = None if ports.cache_metrics is None else f"http://{HOST}:{ports.cache_metrics}/metrics"
    return Backend(server.grpc_url, server.http_url, f"http://{HOST}:{ports.metrics}/metrics", cache)


def fleet_ports(count: int, base_port: int = 0) -> list[Ports]:
    """`count` sets of distinct ports. From `base_port` (not 0): server i takes the four from
    base_port + 4 i on, in `server serve`'s order (HTTP, gRPC, metrics, cache metrics: a base of
    8000 gives server 0 `server serve`'s own ports), each checked free now. Otherwise free ports
    asked for at once (asked one set at a time, a port freed by one question could be the answer
    to the next)."""
    width = len(fields(Ports))
    if base_port:
        ports = list(range(base_port, base_port + count * width))
        if ports[-1] > PORT_MAX:
            raise ConfigError(f"--base-port {base_port}: {count} servers need ports up to {ports[-1]}, past {PORT_MAX}")
        taken = [port for port in ports if not port_free(port)]
        if taken:
            raise ConfigError(f"--base-port {base_port}: port {taken[0]} is taken on {HOST} (the fleet needs "
                              f"{ports[0]}-{ports[-1]})")
    else:
        ports = free_ports(count * width)
    return [Ports(*ports[i * width:(i + 1) * width]) for i in range(count)]


@dataclass(frozen=True)
class FleetTeardown:
    """Each server's teardown, in the fleet's order."""

    servers: tuple[Teardown, ...]

    @property
    def clean(self) -> bool:
        return all(t.clean and not t.forced for t in self.servers)

    def problems(self) -> list[str]:
        """One entry per server that left something behind or had to be killed."""
        return [f"server {i}: {', '.join([f'{f} killed' for f in t.forced] + [f'{l} left' for l in t.left])}"
                for i, t in enumerate(self.servers) if t.forced or t.left]


class LocalFleet:
    """`servers` reference servers of `repository` on loopback, each with a KV cache of
    `cache_budget_tokens` (None: the server's default), their logs in `log_dir`; `serve_args`
    go to every `server serve` (e.g. --device cpu); `base_port` pins the ports (`fleet_ports`). A context manager: started and ready on
    entry, stopped on exit."""

    def __init__(self, repository: Path | str, servers: int, log_dir: Path, cache_budget_tokens: int | None = None,
                 serve_args: Sequence[str] = (), ready_timeout_s: float = 180.0, base_port: int = 0):
        if servers < 1:
            raise ConfigError(f"--servers {servers}: a fleet has at least 1 server")
        if cache_budget_tokens is not None and cache_budget_tokens < 0:
            raise ConfigError(f"--cache-budget-tokens {cache_budget_tokens}: must be >= 0")
        log_dir = Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        budget = () if cache_budget_tokens is None else ("--cache-budget-tokens", str(cache_budget_tokens))
        self.servers = [ServerProcess.serve(repository, log_dir / f"server{i}.log", ports, *budget, *serve_args,
                                            ready_timeout_s=ready_timeout_s)
                        for i, ports in enumerate(fleet_ports(servers, base_port))]
        self._teardown: FleetTeardown | None = None

    @property
    def backends(self) -> tuple[Backend, ...]:
        return tuple(backend_of(server) for server in self.servers)

    def start(self) -> LocalFleet:
        """Every server started, then each awaited; on any failure all are stopped and a
        ServerError names the server and its own error line."""
        try:
            for server in self.servers:
                server.start()
            for i, server in enumerate(self.servers):
                try:
                    server.wait_ready()
                except StartFailed as exc:
                    raise ServerError(f"server {i} of the fleet: {exc}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def failure(self) -> str | None:
        """One line when a server has exited, else None."""
        for i, server in enumerate(self.servers):
            if (line := server.failure()) is not None:
                return f"server {i} of the fleet: {line}"
        return None

    def stop(self) -> FleetTeardown:
        """Every server stopped at once (each with its checked teardown); safe more than once."""
        if self._teardown is None:
            with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
                self._teardown = FleetTeardown(tuple(pool.map(lambda server: server.stop(), self.servers)))
        return self._teardown

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
