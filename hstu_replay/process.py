"""A server as a child process: started on loopback ports with its output in a log, ready when
its model answers ready over HTTP, stopped with everything it started.

Every caller that runs a server of its own (the L0 flow, the capacity drivers, the benchmarks,
the tests) goes through `ServerProcess`; `hstu-replay server wait` applies the same readiness
rule to a server started by a shell script. Torch-free: load-generator tools import it.

A server that dies while starting is reported with its own error line from that log (and the
log's path), at once, never as a readiness time-out. Stopping is SIGTERM, then SIGKILL after a
grace period; then every process the server was seen to start (tritonserver, backend stubs, its
watchdog) must be gone and every port free, else the leftovers are killed and named.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path

from hstu_replay.interface import CONTROL_MODEL, INTERFACES
from hstu_replay.server.watchdog import descendants, kill_noted, proc_stat

HOST = "127.0.0.1"
#: The models whose readiness says the reference server serves (it loads them one after another).
SERVED_MODELS = (*(interface.model_name for interface in INTERFACES.values()), CONTROL_MODEL)
STOP_GRACE_S = 60.0
GONE_TIMEOUT_S = 15.0
POLL_S = 0.25

# Most telling first: tritonserver's own glog errors (E1130 19:21:07.123 ...), then the line our
# CLI ends with, then the last line of a Python traceback.
_ERROR_LINES = (re.compile(r"^E\d{4} "), re.compile(r"^hstu-replay: error: "),
                re.compile(r"^[A-Za-z_.]*(Error|Exception): "))
#: tritonserver's error lines that every start on a CPU-only machine logs (seen with the bundled 2.51).
_BENIGN = ("CudaDriverHelper has not been initialized", "Failed to set config modification time")


class StartFailed(Exception):
    """The server exited or never became ready; the message is one line."""


def free_ports(n: int, host: str = HOST) -> list[int]:
    """`n` ports free on `host` at the time of asking."""
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind((host, 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def port_free(port: int, host: str = HOST) -> bool:
    """Nothing listens on `port` (TIME_WAIT leftovers do not count: servers bind with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return True
        except OSError:
            return False


@dataclass(frozen=True)
class Ports:
    """A server's loopback ports; `cache_metrics` only where it serves the KV-cache counters."""

    http: int
    grpc: int
    metrics: int
    cache_metrics: int | None = None

    @classmethod
    def free(cls, cache_metrics: bool = True) -> Ports:
        return cls(*free_ports(4 if cache_metrics else 3))

    def all(self) -> tuple[int, ...]:
        return tuple(port for port in astuple(self) if port is not None)


@dataclass(frozen=True)
class Teardown:
    exit_code: int | None  # the server's exit status; negative: killed by that signal
    forced: tuple[str, ...]  # processes killed after the grace period ("pid N")
    left: tuple[str, ...]  # what still runs or listens after everything ("pid N", "port P")

    @property
    def clean(self) -> bool:
        return not self.left


def serve_command(repository: Path | str, ports: Ports, *extra: str) -> list[str]:
    """The `hstu-replay server serve` command line on loopback `ports`, then `extra` options."""
    command = [sys.executable, "-m", "hstu_replay.cli", "server", "serve", "--repository", str(repository),
               "--host", HOST, "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
               "--metrics-port", str(ports.metrics)]
    if ports.cache_metrics is not None:
        command += ["--cache-metrics-port", str(ports.cache_metrics)]
    return [*command, *extra]


def server_error_line(log_text: str) -> str:
    """The line of a server log that says why it failed."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for pattern in _ERROR_LINES:
        found = [line for line in lines if pattern.search(line) and not any(b in line for b in _BENIGN)]
        if found:
            return found[-1]
    return lines[-1] if lines else "no output"


def model_ready(http_port: int, models: Sequence[str] = SERVED_MODELS, host: str = HOST) -> Callable[[], bool]:
    """The readiness rule: Triton's `/v2/models/<model>/ready` answers 200 on `host:http_port`, for every model."""
    netloc = f"[{host}]:{http_port}" if ":" in host else f"{host}:{http_port}"
    urls = [f"http://{netloc}/v2/models/{model}/ready" for model in models]

    def answers(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as response:  # noqa: S310 - loopback http only
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    return lambda: all(answers(url) for url in urls)


def models_named(models: Sequence[str]) -> str:
    return ("model " if len(models) == 1 else "models ") + ", ".join(models)


def wait_ready(ready: Callable[[], bool], what: str, exited: Callable[[], str | None], log: Path,
               timeout_s: float, note: Callable[[], None] = lambda: None) -> float:
    """The one waiting loop: seconds until `ready()`; StartFailed with the server's own error line
    when `exited()` says how the server ended first, or `what` is not ready after `timeout_s`.
    `note` runs on every round."""
    started = time.monotonic()
    while True:
        note()
        if (how := exited()) is not None:
            raise StartFailed(f"the server exited ({how}) while starting: "
                              f"{server_error_line(_read(log))} (log: {log})")
        if ready():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise StartFailed(f"{what} not ready after {timeout_s:g} s; last log line: "
                              f"{server_error_line(_read(log))} (log: {log})")
        time.sleep(POLL_S)


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C or SIGTERM waits until the block is done: raised inside `Popen`, it would leave a child
    (in a session of its own) that nobody knows the pid of. Only the main thread handles signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, lambda signum, frame: held.append(signum)) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in held[:1]:
            signal.raise_signal(signum)  # now, to the handler that was there before


class ServerProcess:
    """One server child. Made first, started by `start()`, so that whoever holds it can always
    `stop()` it (safe at any point, more than once, started or not). As a context manager it is
    started and waited for on entry and stopped on exit."""

    def __init__(self, command: Sequence[str], log: Path, ports: Ports, models: Sequence[str] = SERVED_MODELS,
                 ready_timeout_s: float = 180.0, cwd: Path | None = None):
        self.command, self.log, self.ports = list(command), Path(log), ports
        self.models, self.ready_timeout_s, self.cwd = tuple(models), ready_timeout_s, cwd
        self.process: subprocess.Popen | None = None
        self.own_ports: tuple[int, ...] = ()
        self.family: dict[int, int] = {}  # pid -> start time of every process seen under the server
        self._teardown: Teardown | None = None

    @classmethod
    def serve(cls, repository: Path | str, log: Path, ports: Ports | None = None, *extra: str,
              ready_timeout_s: float = 180.0, cwd: Path | None = None) -> ServerProcess:
        """`hstu-replay server serve` of `repository` (free ports unless given), not started yet."""
        ports = ports or Ports.free()
        return cls(serve_command(repository, ports, *extra), log, ports, ready_timeout_s=ready_timeout_s, cwd=cwd)

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.ports.http}"

    def url_for(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url

    def start(self) -> None:
        # Ports already taken before the start are someone else's: teardown checks only the others.
        self.own_ports = tuple(port for port in self.ports.all() if port_free(port))
        with self.log.open("wb") as out, _interrupts_held():
            # A session of its own: a Ctrl-C at the terminal reaches the caller, which stops it in order.
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout_s: float | None = None, probe: Callable[[], bool] | None = None) -> float:
        """Seconds until its models answer ready over HTTP (or `probe()`, for a server that is not
        Triton); StartFailed with the server's own error line when it exits first."""
        assert self.process is not None, "start() first"
        process = self.process

        def exited() -> str | None:
            code = process.poll()
            return None if code is None else _status(code)

        ready, what = (probe, "the server") if probe else (model_ready(self.ports.http, self.models),
                                                           models_named(self.models))
        return wait_ready(ready, what, exited, self.log, self.ready_timeout_s if timeout_s is None else timeout_s, self._note_family)

    def launch(self) -> ServerProcess:
        """Started and ready; stopped again (and StartFailed raised) when it does not come up."""
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> ServerProcess:
        return self.launch()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failure(self) -> str | None:
        """One line when the server has exited, else None."""
        code = self.process.poll() if self.process else None
        if code is None:
            return None
        return f"the server exited ({_status(code)}): {server_error_line(_read(self.log))} (log: {self.log})"

    def stop(self, grace_s: float = STOP_GRACE_S) -> Teardown:
        """SIGTERM, SIGKILL after `grace_s`; then what it started must be gone and its ports free."""
        if self._teardown is not None:
            return self._teardown
        if self.process is None:
            self._teardown = Teardown(None, (), ())
            return self._teardown
        self._note_family()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        forced: list[str] = []
        left = self._left_behind(GONE_TIMEOUT_S)
        if left:
            forced = [f"pid {pid}" for pid in kill_noted(self.family)]
            left = self._left_behind(5.0)
        self._teardown = Teardown(self.process.returncode, tuple(forced), tuple(left))
        return self._teardown

    def _note_family(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.family.update(descendants(self.process.pid))
            if (stat := proc_stat(self.process.pid)) is not None:
                self.family[self.process.pid] = stat[1]

    def _left_behind(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [f"pid {pid}" for pid, start in self.family.items()
                     if (stat := proc_stat(pid)) is not None and stat[1] == start]
            left = alive + [f"port {port}" for port in self.own_ports if not port_free(port)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(POLL_S)


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"
