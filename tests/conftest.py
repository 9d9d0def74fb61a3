"""Shared fixtures: one compiled small target, one real tritonserver on loopback per test session.

Integration tests (marked `integration`) use the real server started here through
`hstu-replay server serve`, and real Locust processes through `run_locust`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hstu_replay.flow.server import port_free  # noqa: E402
from hstu_replay.server.serve import free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "datasets" / "sample"
LOCUSTFILE = ROOT / "locustfiles" / "hstu.py"
BIN = Path(sys.executable).parent




class Loopback:
    """Addresses of a server on 127.0.0.1 with `grpc_port` and `http_port`."""

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"


@dataclass(frozen=True)
class ServerHandle(Loopback):
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    cache_metrics_port: int
    log: Path
    family: dict = None  # pid -> start time of every process the server had started once ready


def start_server(repository: Path, log: Path, *extra: str, ready_timeout: float = 120.0,
                 ports: tuple[int, int, int, int] | None = None) -> ServerHandle:
    http, grpc, metrics, cache_metrics = ports or free_ports(4)
    out = log.open("w")
    process = subprocess.Popen(
        [str(BIN / "hstu-replay"), "server", "serve", "--repository", str(repository), "--device", "cpu",
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
         "--cache-metrics-port", str(cache_metrics), *extra],
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if "hstu-replay: serving" in log.read_text(errors="replace"):
            from hstu_replay.server.watchdog import descendants

            return ServerHandle(process, http, grpc, metrics, cache_metrics, log, descendants(process.pid))
        if process.poll() is not None:
            break
        time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"tritonserver did not become ready:\n{log.read_text(errors='replace')[-3000:]}")


def stop_server(server: ServerHandle, timeout: float = 60.0) -> int:
    """SIGTERM; the exit code once the server and everything it started are gone (checked)."""
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)
        raise
    assert_nothing_left(server)
    return code


def assert_nothing_left(server: ServerHandle, timeout: float = 15.0) -> None:
    """No process the server started (tritonserver, backend stubs) and none of its ports outlives it."""
    from hstu_replay.server.watchdog import _stat

    def left() -> list[str]:
        alive = [f"pid {pid}" for pid, start in (server.family or {}).items()
                 if (stat := _stat(pid)) is not None and stat[1] == start]
        ports = (server.http_port, server.grpc_port, server.metrics_port, server.cache_metrics_port)
        return alive + [f"port {p}" for p in ports if not port_free(p)]

    deadline = time.monotonic() + timeout
    while (remaining := left()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not remaining, f"left behind by the server: {remaining}"


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` (an OSError counts as not yet) until true; fail naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory) -> Path:
    from hstu_replay.data.prepare import prepare

    out = tmp_path_factory.mktemp("store") / "sample"
    prepare(SAMPLE, out)
    return out


@pytest.fixture(scope="session")
def compiled_repository(tmp_path_factory) -> Path:
    """The small config compiled with AOTInductor once per test session."""
    from hstu_replay.server.build import export_repository

    root = tmp_path_factory.mktemp("repository")
    export_repository(root, "small", seed=0, device="cpu")
    return root


@pytest.fixture(scope="session")
def long_store(tmp_path_factory) -> Path:
    """Synthetic users with 300+ events each, so requests can carry near-maximal histories."""
    from hstu_replay.data.prepare import prepare
    from hstu_replay.data.synth import synthesize

    root = tmp_path_factory.mktemp("long")
    synthesize(root / "raw", users=16, seed=5, events_per_user_scale=0.1)
    prepare(root / "raw", root / "store")
    return root / "store"


@pytest.fixture(scope="session")
def full_length_store(tmp_path_factory) -> Path:
    """Synthetic users of 1,500 to 10,000 events: at batch 8 their histories exceed what the
    published 40,000 values allow (2,481 items each with 16 candidates)."""
    from hstu_replay.data.prepare import prepare
    from hstu_replay.data.synth import synthesize

    root = tmp_path_factory.mktemp("full-length")
    synthesize(root / "raw", users=12, seed=7, events_per_user_scale=0.5)
    prepare(root / "raw", root / "store")
    return root / "store"


@pytest.fixture(scope="session")
def reference_dumps(compiled_repository, long_store, tmp_path_factory) -> Path:
    """Cold-cache reference dumps: batches of 8 users with 200..256 history items each."""
    from hstu_replay.server.build import load_engines
    from hstu_replay.server.dump import write_reference_dumps

    out = tmp_path_factory.mktemp("dumps")
    engines = load_engines(compiled_repository, None, 32, "cpu")
    write_reference_dumps(engines.uncached, str(long_store), out, batches=6, batch_size=8, candidates=16,
                          max_history=256, seed=1, min_history=200)
    return out


@pytest.fixture(scope="session")
def triton_server(compiled_repository, tmp_path_factory):
    """A real tritonserver hosting the target; stopped with SIGTERM at the end (must exit 0)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = start_server(compiled_repository, log)
    yield server
    code = stop_server(server)
    assert code == 0, f"server exited {code}:\n{log.read_text(errors='replace')[-2000:]}"


@dataclass(frozen=True)
class LocustResult:
    returncode: int
    stdout: str
    stderr: str
    report_dir: Path

    @property
    def report(self) -> dict:
        return json.loads((self.report_dir / "report.json").read_text())


def locust_command(*args: str) -> list[str]:
    return [str(BIN / "locust"), "-f", str(LOCUSTFILE), *args]


def run_distributed(tmp_path: Path, *args: str, users: int = 4, workers: int = 2,
                    during: Callable[[Path, list[subprocess.Popen]], None] | None = None) -> tuple[int, Path, str]:
    """A real master (headless) and `workers` workers on loopback: exit code, report dir, master log.

    `during(master_log, worker_processes)` runs while they do (e.g. to kill a worker).
    """
    (port,) = free_ports(1)
    report = tmp_path / "report"
    common = ["--loglevel", "INFO", "--report-dir", str(report)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def start(command: list[str], log: Path) -> subprocess.Popen:
        with log.open("w") as out:
            return subprocess.Popen(locust_command(*command), stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)

    master_log = tmp_path / "master.log"
    master = start(["--master", "--headless", "--only-summary", "--expect-workers", str(workers),
                    "--expect-workers-max-wait", "90", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                    str(port), "-u", str(users), "-r", str(users), *args, *common], master_log)
    started = [start(["--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *common],
                     tmp_path / f"worker{i}.log") for i in range(workers)]
    try:
        if during is not None:
            during(master_log, started)
        code = master.wait(240)
        for w in started:
            w.wait(120)
    finally:
        for p in [master, *started]:
            if p.poll() is None:
                p.kill()
    return code, report, master_log.read_text()


def run_locust(report_dir: Path, *args: str, timeout: float = 180.0) -> LocustResult:
    """A real headless Locust run (bounded by `timeout`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        locust_command("--headless", "--only-summary", "--loglevel", "WARNING", "--report-dir", str(report_dir),
                       *args),
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )
    return LocustResult(proc.returncode, proc.stdout, proc.stderr, report_dir)


# ---------------------------------------------------------------------------------------------------------
# The KV-cache oracle (tests/oracle/server.py): an independent server that records what it was sent.

from collections.abc import Iterator  # noqa: E402


@dataclass(frozen=True)
class OracleHandle(Loopback):
    """One running oracle variant; `log` is its JSON-lines record of requests, `output` its stdout/stderr."""

    process: subprocess.Popen
    grpc_port: int
    http_port: int
    metrics_port: int
    log: Path
    output: Path

    def records(self) -> list[dict]:
        from tests.oracle.server import read_log

        return read_log(self.log)


def _group_alive(pgid: int) -> list[str]:
    """Processes of group `pgid` that are not zombies, as "pid state command"."""
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(f"{proc.name} {fields[0]} {stat[stat.index('(') + 1:stat.rindex(')')]}")
    return alive


def stop_oracle(handle: OracleHandle, timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL to the process group; fails if anything of the group is still running."""
    pgid = handle.process.pid  # launched with start_new_session=True
    if handle.process.poll() is None:
        handle.process.send_signal(signal.SIGTERM)
        try:
            handle.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    handle.process.wait(10)
    deadline = time.monotonic() + 10
    while (left := _group_alive(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"oracle processes left running: {left}"


@pytest.fixture(scope="session")
def oracle_servers(tmp_path_factory) -> Iterator[Callable[..., OracleHandle]]:
    """`get(cached_tokens, budget_tokens=0, page_tokens=32, max_values=40000) -> OracleHandle`: each distinct
    variant is started once per session on free ports and stopped at the end. Its cache and log are shared by
    every test that asks for that variant: use keys of your own and look only at records you caused."""
    if str(ROOT) not in sys.path:  # `bench` is a plain folder of the checkout
        sys.path.insert(0, str(ROOT))
    from bench.harness import ChildServer
    from tests.oracle.server import READY

    started: dict[tuple[bool, int, int, int], OracleHandle] = {}

    def get(cached_tokens: bool, budget_tokens: int = 0, page_tokens: int = 32,
            max_values: int = 40000) -> OracleHandle:
        variant = (cached_tokens, budget_tokens, page_tokens, max_values)
        if variant not in started:
            root = tmp_path_factory.mktemp("oracle")
            grpc, http, metrics = free_ports(3)
            command = [sys.executable, "-m", "tests.oracle.server", "--grpc-port", str(grpc),
                       "--http-port", str(http), "--metrics-port", str(metrics), "--log", str(root / "requests.jsonl"),
                       "--budget-tokens", str(budget_tokens), "--page-tokens", str(page_tokens),
                       "--max-values", str(max_values)]
            if cached_tokens:
                command.append("--cached-tokens")
            server = ChildServer.launch(command, grpc, root / "server.log", READY, timeout_s=120.0)
            started[variant] = OracleHandle(server.process, grpc, http, metrics, root / "requests.jsonl",
                                            root / "server.log")
        return started[variant]

    yield get
    problems = []
    for handle in started.values():
        try:
            stop_oracle(handle)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, problems


pytest_plugins = ["tests.certs"]  # `secure`: one TLS server per session, for tests/client and tests/loadtest
