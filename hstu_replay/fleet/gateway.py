"""HAProxy in front of a fleet: its configuration (`config_text`) and the running gateway (`Gateway`).

Two frontends on loopback: gRPC (HTTP/2 in clear text, `proto h2` both ways: each gRPC call is
one HTTP/2 stream, balanced on its own) and HTTP/1.1 (each request of a kept-alive connection
balanced on its own), each to the backends' ports of its protocol. The balance (`--balance` /
`--gateway`) is a registry entry:

- `hash`: by the routing header, which the client fills with each request's route key (the
  virtual user that made its cache key, in decimal): `balance hdr(NAME)` with `hash-type
  consistent sdbm avalanche`. Consistent: a server added or lost moves only its own share of the
  keys. Avalanche: route keys are short decimal numbers, and sdbm's raw value of such strings
  clusters (measured: keys 0..63 all on one server of 2, 3 or 4); mixing its bits first spreads
  them. It is what HAProxy takes for `consistent` when no function is named; written out here so
  the config says what it does. Every server has the same weight, `SERVER_WEIGHT`, well above
  HAProxy's default of 1, for more points each on the hash tree. A request without the header is
  balanced round-robin.
- `round-robin`: each request to the next server whatever its key, what a plain balancer does.

The gateway is a `process.Child` (`haproxy -db -f haproxy.cfg`, in the foreground), ready when
both its ports accept connections.
"""

from __future__ import annotations

import enum
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hstu_replay.client.triton import HEADER_NAME
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.fleet.local import Backend
from hstu_replay.process import HOST, PORT_MAX, Child, StartFailed, free_ports

HAPROXY = "haproxy"  # Debian's package `haproxy`
DEBIAN_SBIN = "/usr/sbin"
DEFAULT_ROUTING_HEADER = "x-hstu-route"
GATEWAY_READY_TIMEOUT_S = 15.0
CONNECT_TIMEOUT = "5s"
#: a client's or server's silence before HAProxy drops the connection: longer than any request
#: and than the load generator's pauses between stages
IDLE_TIMEOUT = "10m"
CONFIG_NAME = "haproxy.cfg"
ALERT = "[ALERT]"  # how HAProxy's fatal lines begin
#: every server's weight: all equal, so only the number of points each has on HAProxy's consistent
#: hash tree grows with it (at HAProxy's default of 1, 4 servers took 16% to 31% of 1,024 route keys)
SERVER_WEIGHT = 64


class Balance(enum.Enum):
    HASH = "hash"
    ROUND_ROBIN = "round-robin"


#: --balance -> the backend lines that choose a server (given the routing header's name)
BALANCE_LINES: dict[Balance, Callable[[str], tuple[str, ...]]] = {
    Balance.HASH: lambda header: (f"balance hdr({header})", "hash-type consistent sdbm avalanche"),
    Balance.ROUND_ROBIN: lambda header: ("balance roundrobin",),
}


def balance(name: str, flag: str = "--balance") -> Balance:
    try:
        return Balance(name)
    except ValueError:
        raise ConfigError(f"{flag} {name!r}: use {' or '.join(b.value for b in Balance)}") from None


def routing_header(name: str) -> str:
    """The header name, lower case; one line when it has characters a header name cannot carry."""
    if not HEADER_NAME.fullmatch(name):
        raise ConfigError(f"--routing-header {name!r}: a header name is letters, digits and !#$%&'*+-.^_`|~ only")
    return name.lower()


def host_port(text: str, what: str) -> str:
    """`host:port` checked (a port 1..65535, a host without spaces or commas); one line naming `what`."""
    host, _, port = text.strip().rpartition(":")
    if not host or any(c.isspace() or c == "," for c in host) or not port.isdigit() or not 0 < int(port) <= PORT_MAX:
        raise ConfigError(f"{what} {text!r}: give host:port")
    return f"{host}:{int(port)}"


def backend_spec(text: str) -> Backend:
    """`grpc=H:P,http=H:P` (--backend): one server's two addresses."""
    parts = dict(part.partition("=")[::2] for part in text.split(","))
    if set(parts) != {"grpc", "http"} or text.count("=") != 2:
        raise ConfigError(f"--backend {text!r}: give grpc=HOST:PORT,http=HOST:PORT")
    return Backend(host_port(parts["grpc"], f"--backend {text!r}: grpc"),
                   host_port(parts["http"], f"--backend {text!r}: http"))


@dataclass(frozen=True)
class GatewayPorts:
    """Where the gateway listens, on loopback."""

    grpc: int
    http: int

    @classmethod
    def free(cls, grpc: int = 0, http: int = 0) -> GatewayPorts:
        """These ports, a free one for each given as 0."""
        free = iter(free_ports(2))
        return cls(grpc or next(free), http or next(free))


@dataclass(frozen=True)
class GatewaySpec:
    """What the configuration says: the backends, how a server is chosen, where it listens."""

    backends: tuple[Backend, ...]
    balance: Balance
    header: str
    ports: GatewayPorts

    def __post_init__(self):
        if not self.backends:
            raise ConfigError("a gateway needs at least one backend")
        object.__setattr__(self, "header", routing_header(self.header))
        addresses = [b.address(protocol) for b in self.backends for protocol in ("grpc", "http")]
        twice = [a for i, a in enumerate(addresses) if a in addresses[:i]]
        if twice:
            raise ConfigError(f"--backend: address {twice[0]} given twice")
        if self.ports.grpc == self.ports.http:
            raise ConfigError(f"gateway ports: gRPC and HTTP both on {self.ports.grpc}")


def _backend_section(name: str, spec: GatewaySpec, protocol: str, server_options: str) -> list[str]:
    lines = [f"backend {name}"]
    lines += [f"    {line}" for line in BALANCE_LINES[spec.balance](spec.header)]
    lines += [f"    server s{i} {b.address(protocol)} id {i + 1} weight {SERVER_WEIGHT} check{server_options}"
              for i, b in enumerate(spec.backends)]
    return lines


def config_text(spec: GatewaySpec) -> str:
    """The haproxy.cfg of `spec`."""
    lines = [
        f"# HAProxy in front of {len(spec.backends)} Triton server(s), balance {spec.balance.value}"
        + (f" by header {spec.header}" if spec.balance is Balance.HASH else ""),
        "defaults",
        "    mode http",
        f"    timeout connect {CONNECT_TIMEOUT}",
        f"    timeout client {IDLE_TIMEOUT}",
        f"    timeout server {IDLE_TIMEOUT}",
        "",
        "# gRPC: HTTP/2 in clear text from the clients and to the servers, each call balanced",
        "frontend grpc",
        f"    bind {HOST}:{spec.ports.grpc} proto h2",
        "    default_backend grpc_servers",
        *_backend_section("grpc_servers", spec, "grpc", " proto h2"),
        "",
        "# HTTP/1.1: each request of a kept-alive connection balanced",
        "frontend http",
        f"    bind {HOST}:{spec.ports.http}",
        "    default_backend http_servers",
        *_backend_section("http_servers", spec, "http", ""),
    ]
    return "\n".join(lines) + "\n"


def accepts(port: int, host: str = HOST) -> bool:
    """Something listens on `host:port`."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def find_haproxy() -> str | None:
    """HAProxy's path: on the PATH, else where Debian puts it (/usr/sbin is not on every user's PATH)."""
    return shutil.which(HAPROXY) or shutil.which(HAPROXY, path=DEBIAN_SBIN)


def haproxy_binary() -> str:
    found = find_haproxy()
    if found is None:
        raise ServerError(f"{HAPROXY} not found: install Debian's package (apt-get install -y {HAPROXY})")
    return found


class Gateway(Child):
    """HAProxy of `spec`, its configuration and log in `directory`; ready when both ports accept."""

    def __init__(self, spec: GatewaySpec, directory: Path, ready_timeout_s: float = GATEWAY_READY_TIMEOUT_S):
        self.spec = spec
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / CONFIG_NAME
        self.config.write_text(config_text(spec))
        ports = (spec.ports.grpc, spec.ports.http)
        super().__init__([haproxy_binary(), "-db", "-f", str(self.config)], directory / "haproxy.log",
                         name="the gateway", ready=lambda: all(accepts(p) for p in ports),
                         what=f"{HAPROXY} on ports {ports[0]}, {ports[1]}", ready_timeout_s=ready_timeout_s,
                         listens=ports)

    def launch(self) -> Gateway:
        """Started and ready; else a ServerError with HAProxy's first alert (the cause: its last one
        only says that it is exiting)."""
        try:
            return super().launch()
        except StartFailed as exc:
            alerts = [line.strip() for line in _text(self.log).splitlines() if line.startswith(ALERT)]
            raise ServerError(f"the gateway did not start: {alerts[0]} (log: {self.log})" if alerts
                              else str(exc)) from None

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.spec.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.spec.ports.http}"

    def url_for(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url


def gateway_for(backends: Sequence[Backend], directory: Path, balance: Balance = Balance.HASH,
                header: str = DEFAULT_ROUTING_HEADER, ports: GatewayPorts | None = None) -> Gateway:
    """A gateway in front of `backends` on free loopback ports (unless given), not started yet."""
    return Gateway(GatewaySpec(tuple(backends), balance, header, ports or GatewayPorts.free()), directory)


def _text(path: Path | None) -> str:
    try:
        return "" if path is None else path.read_text(errors="replace")
    except OSError:
        return ""
