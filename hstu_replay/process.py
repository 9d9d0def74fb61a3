"""Child processes with one lifecycle, a server among them; free ports; the `server serve` command line.

`Child` is every child process this project runs: started in a session of its own (a Ctrl-C at the
terminal reaches the caller, which stops it in order) with its output in a log file (or in the
caller's own output), ready when its readiness predicate says so, stopped with a bounded grace
period and then killed, its teardown checked. A server (`ServerProcess`), a capacity step
(`capacity.step_run`), the python-backend frontend's tritonserver (`server.python_backend`), the benchmarks'
clients and do-nothing servers are configurations of it. `hstu-replay server wait` applies the same
readiness loop to a server started by a shell script. Torch-free: load-generator tools import it.

A child that dies while starting is reported with its own error line from its log (and the log's
path), at once, never as a readiness time-out. Stopping is the child's stop signal (SIGTERM unless
configured otherwise), then SIGKILL to its whole session after the grace period; then every process
it was seen to start (tritonserver, backend stubs, a watchdog) must be gone and every port it was to
listen on free, else the leftovers are killed and named. Processes are looked at through
`hstu_replay.inspection`.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import IO, Any

from hstu_replay.inspection import Noted, family, kill_noted, still_running
from hstu_replay.interface import CONTROL_MODEL, INTERFACES

HOST = "127.0.0.1"
PORT_MAX = 65535  # the highest TCP port
#: The models whose readiness says the reference server serves (it loads them one after another).
SERVED_MODELS = (*(interface.model_name for interface in INTERFACES.values()), CONTROL_MODEL)
STOP_GRACE_S = 60.0
KILL_WAIT_S = 10.0  # for the child itself to be reaped after SIGKILL
GONE_TIMEOUT_S = 15.0  # for what it started to go after it did
LEFTOVER_WAIT_S = 5.0  # for leftovers to go after they were killed
POLL_S = 0.25

# Most telling first: tritonserver's own glog errors (E1130 19:21:07.123 ...), then the line our
# CLI ends with, then the last line of a Python traceback.
_ERROR_LINES = (re.compile(r"^E\d{4} "), re.compile(r"^hstu-replay: error: "),
                re.compile(r"^[A-Za-z_.]*(Error|Exception): "))
#: tritonserver's error lines that every start on a CPU-only machine logs (seen with the bundled 2.51).
_BENIGN = ("CudaDriverHelper has not been initialized", "Failed to set config modification time")


class StartFailed(Exception):
    """The child exited or never became ready; the message is one line."""


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
    exit_code: int | None  # the child's exit status; negative: killed by that signal
    forced: tuple[str, ...]  # processes killed after the grace period ("pid N")
    left: tuple[str, ...]  # what still runs or listens after everything ("pid N", "port P")

    @property
    def clean(self) -> bool:
        return not self.left


@dataclass(frozen=True)
class Stopping:
    """How a child is asked to end: `signal` to it (to its whole session with `group`: a Locust run
    and whatever it started), SIGKILL to its session when it still runs `grace_s` later."""

    signal: int = signal.SIGTERM
    grace_s: float = STOP_GRACE_S
    group: bool = False


def serve_command(repository: Path | str, ports: Ports, *extra: str) -> list[str]:
    """The `hstu-replay server serve` command line on loopback `ports`, then `extra` options."""
    command = [sys.executable, "-m", "hstu_replay.cli", "server", "serve", "--repository", str(repository),
               "--host", HOST, "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
               "--metrics-port", str(ports.metrics)]
    if ports.cache_metrics is not None:
        command += ["--cache-metrics-port", str(ports.cache_metrics)]
    return [*command, *extra]


def server_error_line(log_text: str) -> str:
    """The line of a child's log that says why it failed."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for pattern in _ERROR_LINES:
        found = [line for line in lines if pattern.search(line) and not any(b in line for b in _BENIGN)]
        if found:
            return found[-1]
    return lines[-1] if lines else "no output"


def log_error_line(log: Path) -> str:
    """The telling line of a child's log file ("no output" when it is empty or unreadable)."""
    return server_error_line(_read(log))


def log_reason(log: Path | None, lead: str = ": ") -> str:
    """Why a child failed, to end a message: `lead`, its log's telling line and where the log is (a
    child without a log file wrote into its parent's output)."""
    return "; see its output above" if log is None else f"{lead}{log_error_line(log)} (log: {log})"


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


def wait_ready(ready: Callable[[], bool], what: str, exited: Callable[[], str | None], log: Path | None,
               timeout_s: float, note: Callable[[], None] = lambda: None, name: str = "the server") -> float:
    """The one waiting loop: seconds until `ready()`; StartFailed with the child's own error line
    when `exited()` says how `name` ended first, or `what` is not ready after `timeout_s`.
    `note` runs on every round."""
    started = time.monotonic()
    while True:
        note()
        if (how := exited()) is not None:
            raise StartFailed(f"{name} exited ({how}) while starting{log_reason(log)}")
        if ready():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            raise StartFailed(f"{what} not ready after {timeout_s:g} s{log_reason(log, '; last log line: ')}")
        time.sleep(POLL_S)


def honour_sigint() -> None:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt in this process however it was started: a shell
    starts a background job (`cmd &` in a script, `nohup`) with SIGINT ignored, and a long-running
    command that inherited that never stopped on it. Only the main thread handles signals."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def long_running(command: Callable[[Any], int]) -> Callable[[Any], int]:
    """A command's handler that runs for long (a server, a search, a flow): it honours Ctrl-C first."""

    @functools.wraps(command)
    def run(args: Any) -> int:
        honour_sigint()
        return command(args)

    return run


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


@contextmanager
def _output(log: Path | None) -> Iterator[IO[bytes] | None]:
    if log is None:
        yield None
        return
    with log.open("wb") as out:
        yield out


class Child:
    """One child process. Made first, started by `start()`, so that whoever holds it can always
    `stop()` it (safe at any point, more than once, started or not). As a context manager it is
    launched (started, and waited for when it has a readiness predicate) on entry, stopped on exit.

    `log`: its stdout and stderr (None: the caller's own); `ready`: true once it serves (`what` names
    it in a time-out); `listens`: ports it will listen on, which must be free again after it."""

    def __init__(self, command: Sequence[str], log: Path | None, *, name: str = "the child",
                 cwd: Path | None = None, env: Mapping[str, str] | None = None, stopping: Stopping = Stopping(),
                 ready: Callable[[], bool] | None = None, what: str = "", ready_timeout_s: float = 180.0,
                 listens: Sequence[int] = ()):
        self.command, self.log = list(command), None if log is None else Path(log)
        self.name, self.cwd, self.env, self.stopping = name, cwd, None if env is None else dict(env), stopping
        self.ready, self.what, self.ready_timeout_s = ready, what or name, ready_timeout_s
        self.listens = tuple(listens)
        self.process: subprocess.Popen | None = None
        self.own_ports: tuple[int, ...] = ()
        self.family: Noted = {}  # pid -> start time of the child and every process seen under it
        self._teardown: Teardown | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "start() first"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        # Ports already taken before the start are someone else's: teardown checks only the others.
        self.own_ports = tuple(port for port in self.listens if port_free(port))
        with _interrupts_held(), _output(self.log) as out:  # held first: a Ctrl-C as the log appears waits too
            self.process = subprocess.Popen(self.command, stdout=out, stderr=None if out is None else subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.cwd, env=self.env,
                                            start_new_session=True)

    def exited(self) -> str | None:
        """How the child ended ("exit 2", "killed by signal 9"); None while it runs."""
        code = self.process.poll() if self.process is not None else None
        return None if code is None else _status(code)

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Seconds until `ready()` (0 for a child without a readiness predicate); StartFailed with
        the child's own error line when it exits first."""
        assert self.process is not None, "start() first"
        if self.ready is None:
            return 0.0
        return wait_ready(self.ready, self.what, self.exited, self.log,
                          self.ready_timeout_s if timeout_s is None else timeout_s, self.note_family, self.name)

    def launch(self):
        """Started and ready; stopped again (and StartFailed raised) when it does not come up."""
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self):
        return self.launch()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self, timeout_s: float, every_s: float = POLL_S, each: Callable[[], None] | None = None) -> bool:
        """Until the child ends (True) or `timeout_s` has passed (False); `each` runs every `every_s`
        meanwhile, and what the child started is noted."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            self.note_family()
            try:
                self.process.wait(min(every_s, left))
                return True
            except subprocess.TimeoutExpired:
                if each is not None and deadline - time.monotonic() > 0:
                    each()
        return self.process.poll() is not None

    def failure(self) -> str | None:
        """One line when the child has exited, else None."""
        how = self.exited()
        return None if how is None else f"{self.name} exited ({how}){log_reason(self.log)}"

    def stop(self, grace_s: float | None = None) -> Teardown:
        """The stop signal, SIGKILL after `grace_s` (default: its own); then what it started must be
        gone and its ports free."""
        if self._teardown is not None:
            return self._teardown
        if self.process is None:
            self._teardown = Teardown(None, (), ())
            return self._teardown
        self.note_family()
        process = self.process
        if process.poll() is None:
            self._signal(self.stopping.signal, self.stopping.group)
            try:
                process.wait(self.stopping.grace_s if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL, True)
                process.wait(KILL_WAIT_S)
        forced: list[str] = []
        left = self._left_behind(GONE_TIMEOUT_S)
        if left:
            forced = [f"pid {pid}" for pid in kill_noted(self.family)]
            left = self._left_behind(LEFTOVER_WAIT_S)
        self._teardown = Teardown(process.returncode, tuple(forced), tuple(left))
        return self._teardown

    def note_family(self) -> None:
        if self.running:
            self.family.update(family(self.pid))

    def _signal(self, signum: int, group: bool) -> None:
        try:
            if group:  # its session is its process group: it was started as the leader of both
                os.killpg(self.pid, signum)
            else:
                self.process.send_signal(signum)
        except ProcessLookupError:
            pass

    def _left_behind(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = [f"pid {pid}" for pid in still_running(self.family)]
            left += [f"port {port}" for port in self.own_ports if not port_free(port)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(POLL_S)


class ServerProcess(Child):
    """A Triton server child on loopback `ports`: ready when every one of `models` answers ready."""

    def __init__(self, command: Sequence[str], log: Path, ports: Ports, models: Sequence[str] = SERVED_MODELS,
                 ready_timeout_s: float = 180.0, cwd: Path | None = None):
        self.ports, self.models = ports, tuple(models)
        super().__init__(command, log, name="the server", cwd=cwd, ready=model_ready(ports.http, self.models),
                         what=models_named(self.models), ready_timeout_s=ready_timeout_s, listens=ports.all())

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


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"
