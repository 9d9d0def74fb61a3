"""`hstu-replay server serve` as a child process: started on loopback ports with its output in a
log, ready when its model answers ready, stopped with everything it started.

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
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from hstu_replay.server.watchdog import _stat, descendants, kill_noted

HOST = "127.0.0.1"
STOP_GRACE_S = 60.0
GONE_TIMEOUT_S = 15.0

# Most telling first: tritonserver's own glog errors (E1130 19:21:07.123 ...), then the line our
# CLI ends with, then the last line of a Python traceback.
_ERROR_LINES = (re.compile(r"^E\d{4} "), re.compile(r"^hstu-replay: error: "),
                re.compile(r"^[A-Za-z_.]*(Error|Exception): "))
#: tritonserver's error lines that every start on a CPU-only machine logs (seen with the bundled 2.51).
_BENIGN = ("CudaDriverHelper has not been initialized", "Failed to set config modification time")


class StartFailed(Exception):
    """The server exited or never became ready; the message is one line."""


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int
    cache_metrics: int

    def all(self) -> tuple[int, ...]:
        return (self.http, self.grpc, self.metrics, self.cache_metrics)


@dataclass(frozen=True)
class Teardown:
    exit_code: int | None  # the server's exit status; negative: killed by that signal
    forced: tuple[str, ...]  # processes killed after the grace period ("pid N")
    left: tuple[str, ...]  # what still runs or listens after everything ("pid N", "port P")

    @property
    def clean(self) -> bool:
        return not self.left


def port_free(port: int) -> bool:
    """Nothing listens on `port` (TIME_WAIT leftovers do not count: servers bind with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
            return True
        except OSError:
            return False


def server_error_line(log_text: str) -> str:
    """The line of a server log that says why it failed."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for pattern in _ERROR_LINES:
        found = [line for line in lines if pattern.search(line) and not any(b in line for b in _BENIGN)]
        if found:
            return found[-1]
    return lines[-1] if lines else "no output"


class ServerProcess:
    """One `server serve` child. Made first, started by `start()`, so that whoever holds it can
    always `stop()` it (safe at any point, more than once, started or not)."""

    def __init__(self, command: list[str], log: Path, ports: Ports):
        self.command, self.log, self.ports = command, log, ports
        self.process: subprocess.Popen | None = None
        self.own_ports: tuple[int, ...] = ()
        self.family: dict[int, int] = {}  # pid -> start time of every process seen under the server
        self._teardown: Teardown | None = None

    @classmethod
    def of_target(cls, repository: Path, log: Path, ports: Ports, *extra: str) -> ServerProcess:
        command = [sys.executable, "-m", "hstu_replay.cli", "server", "serve", "--repository", str(repository),
                   "--host", HOST, "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
                   "--metrics-port", str(ports.metrics), "--cache-metrics-port", str(ports.cache_metrics), *extra]
        return cls(command, log, ports)

    def start(self) -> None:
        # Ports already taken before the start are someone else's: teardown checks only the others.
        self.own_ports = tuple(port for port in self.ports.all() if port_free(port))
        with self.log.open("wb") as out:
            # A session of its own: a Ctrl-C at the terminal reaches the flow, which stops it in order.
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, model: str, timeout_s: float) -> float:
        """Seconds until `model` is ready; StartFailed with the server's own error when it exits first."""
        assert self.process is not None, "start() first"
        started = time.monotonic()
        url = f"http://{HOST}:{self.ports.http}/v2/models/{model}/ready"
        while True:
            self._note_family()
            code = self.process.poll()
            if code is not None:
                raise StartFailed(f"the server exited ({_status(code)}) while starting: "
                                  f"{server_error_line(self._log_text())} (log: {self.log})")
            if _answers_ready(url):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise StartFailed(f"model {model} not ready after {timeout_s:g} s; last log line: "
                                  f"{server_error_line(self._log_text())} (log: {self.log})")
            time.sleep(0.25)

    def failure(self) -> str | None:
        """One line when the server has exited, else None."""
        code = self.process.poll() if self.process else None
        if code is None:
            return None
        return f"the server exited ({_status(code)}): {server_error_line(self._log_text())} (log: {self.log})"

    def stop(self) -> Teardown:
        if self._teardown is not None:
            return self._teardown
        if self.process is None:
            self._teardown = Teardown(None, (), ())
            return self._teardown
        self._note_family()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
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
            if (stat := _stat(self.process.pid)) is not None:
                self.family[self.process.pid] = stat[1]

    def _left_behind(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = [f"pid {pid}" for pid, start in self.family.items()
                     if (stat := _stat(pid)) is not None and stat[1] == start]
            left = alive + [f"port {port}" for port in self.own_ports if not port_free(port)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.25)

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _answers_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:  # noqa: S310 - loopback http only
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"
