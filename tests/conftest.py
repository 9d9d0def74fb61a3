"""Shared fixtures: one compiled small target, one real tritonserver on loopback per test session.

Integration tests (marked `integration`) use the real server started here through
`hstu-replay server serve`, and real Locust processes through `run_locust`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hstu_replay.loadtest.command import LOCUSTFILE, headless_command, locust_command  # noqa: F401 - for the tests
from hstu_replay.process import Ports, ServerProcess, free_ports  # noqa: F401 - for the tests

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "datasets" / "sample"
BIN = Path(sys.executable).parent


def start_server(repository: Path, log: Path, *extra: str, ready_timeout: float = 120.0,
                 ports: Ports | None = None) -> ServerProcess:
    """`server serve` of `repository` on CPU, started and ready (ServerProcess: `.grpc_url`, `.ports`, `.process`)."""
    return ServerProcess.serve(repository, log, ports, "--device", "cpu", *extra, ready_timeout_s=ready_timeout,
                               cwd=ROOT).launch()


def stop_server(server: ServerProcess) -> int | None:
    """SIGTERM; the exit code once the server and everything it started are gone by themselves (checked)."""
    teardown = server.stop()
    assert not teardown.forced and teardown.clean, f"left behind by the server: {teardown.forced + teardown.left}"
    return teardown.exit_code


def assert_nothing_left(server: ServerProcess) -> None:
    """No process the server started (tritonserver, backend stubs) and none of its ports outlives it."""
    stop_server(server)


def sigint_as_in_a_terminal() -> None:
    """Ctrl-C as a shell's foreground job has it (the default: KeyboardInterrupt). A test run started
    in the background (`nohup`, `&`) inherits SIGINT ignored, and so would every child it starts;
    the tests that press Ctrl-C restore it, in the child (`preexec_fn`) or around the test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def foreground_sigint() -> Iterator[None]:
    """This process's Ctrl-C raises KeyboardInterrupt for the test, whatever the runner inherited."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """`name`'s folder, built by `build(folder)` once per test run: where several pytest processes
    share the run (tests/shards.py), the first to ask builds it in their shared folder while the
    others wait on its lock; each then only reads it."""
    from filelock import FileLock

    from tests.shards import shared_folder

    root = shared_folder() or tmp_path_factory.getbasetemp()
    folder, done = root / "built" / name, root / "built" / f"{name}.done"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory) -> Path:
    from hstu_replay.data.prepare import prepare

    return built_once(tmp_path_factory, "store", lambda root: prepare(SAMPLE, root / "sample")) / "sample"


@pytest.fixture(scope="session")
def compiled_repository(tmp_path_factory) -> Path:
    """The small config compiled with AOTInductor once per test run."""
    from hstu_replay.server.build import export_repository

    return built_once(tmp_path_factory, "repository",
                      lambda root: export_repository(root, "small", seed=0, device="cpu"))


@pytest.fixture(scope="session")
def batched_step_repository(tmp_path_factory) -> Path:
    """A repository holding the small config's batched step compiled with AOTInductor (seed 0, pages
    of 32, CPU: what `server serve --engine batched-aoti --config small` looks for), once per run."""
    from hstu_replay.server.build import prepare_engine
    from hstu_replay.server.model_config import get_config

    return built_once(tmp_path_factory, "batched-repository",
                      lambda root: prepare_engine("batched-aoti", root, get_config("small"), 0, 32, "cpu"))


def _synthetic_store(users: int, seed: int, scale: float) -> Callable[[Path], None]:
    from hstu_replay.data.prepare import prepare
    from hstu_replay.data.synth import synthesize

    def build(root: Path) -> None:
        synthesize(root / "raw", users=users, seed=seed, events_per_user_scale=scale)
        prepare(root / "raw", root / "store")

    return build


@pytest.fixture(scope="session")
def long_store(tmp_path_factory) -> Path:
    """Synthetic users with 300+ events each, so requests can carry near-maximal histories."""
    return built_once(tmp_path_factory, "long", _synthetic_store(16, 5, 0.1)) / "store"


@pytest.fixture(scope="session")
def full_length_store(tmp_path_factory) -> Path:
    """Synthetic users of 1,500 to 10,000 events: at batch 8 their histories exceed what the
    published 40,000 values allow (2,481 items each with 16 candidates)."""
    return built_once(tmp_path_factory, "full-length", _synthetic_store(12, 7, 0.5)) / "store"


@pytest.fixture(scope="session")
def reference_dumps(compiled_repository, long_store, tmp_path_factory) -> Path:
    """Cold-cache reference dumps: batches of 8 users with 200..256 history items each."""
    from hstu_replay.server.build import load_engines
    from hstu_replay.server.dump import write_reference_dumps

    def build(out: Path) -> None:
        engines = load_engines(compiled_repository, None, 32, "cpu")
        write_reference_dumps(engines.uncached, str(long_store), out, batches=6, batch_size=8, candidates=16,
                              max_history=256, seed=1, min_history=200)

    return built_once(tmp_path_factory, "dumps", build)


@pytest.fixture(scope="session")
def triton_server(compiled_repository, tmp_path_factory):
    """A real tritonserver hosting the target; stopped with SIGTERM at the end (must exit 0)."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = start_server(compiled_repository, log)
    yield server
    code = stop_server(server)
    assert code == 0, f"server exited {code}:\n{log.read_text(errors='replace')[-2000:]}"


#: the stage flags that judge the machine rather than the code (report/flags.py): on a shared 2-core
#: machine a run may raise them whatever the code does, and a run given any threshold then fails
MACHINE_FLAGS = ("thin", "client-bound")
#: options that keep those flags for runs that mean nothing: a stage of one request is solid, and a
#: minute of loop lag the bound (a client process at 90% of a core stays client-bound: no option sets it)
MACHINE_LENIENT = ("--min-stage-requests", "1", "--max-loop-lag-ms", "60000")


def beyond_the_machine(violations: list[str]) -> list[str]:
    """The threshold violations other than the machine's flags (`MACHINE_FLAGS`)."""
    machine = re.compile(rf"stage \S+ is ({'|'.join(MACHINE_FLAGS)}): ")
    return [v for v in violations if not machine.match(v)]


@dataclass(frozen=True)
class LocustResult:
    returncode: int
    stdout: str
    stderr: str
    report_dir: Path

    @property
    def report(self) -> dict:
        return json.loads((self.report_dir / "report.json").read_text())

    def violations_but_the_machines(self) -> list[str]:
        """The run's threshold violations other than the machine's flags, once its exit code is checked
        to say what its report does (3 with a violation, 0 without)."""
        violations = self.report["thresholds"]["violations"]
        assert self.returncode == (3 if violations else 0), (self.returncode, violations, self.stderr[-2000:])
        return beyond_the_machine(violations)


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
        headless_command(report_dir, *args),
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )
    return LocustResult(proc.returncode, proc.stdout, proc.stderr, report_dir)


# ---------------------------------------------------------------------------------------------------------
# The KV-cache oracle (tests/oracle/server.py): an independent server that records what it was sent.

@dataclass(frozen=True)
class OracleHandle:
    """One running oracle variant; `log` is its JSON-lines record of requests (its output: `server.log`)."""

    server: ServerProcess
    log: Path

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    @property
    def http_url(self) -> str:
        return self.server.http_url

    def records(self) -> list[dict]:
        from tests.oracle.server import read_log

        return read_log(self.log)


@pytest.fixture(scope="session")
def oracle_servers(tmp_path_factory) -> Iterator[Callable[..., OracleHandle]]:
    """`get(cached_tokens, budget_tokens=0, page_tokens=32, max_values=40000, host_budget_tokens=0,
    offload_mode="flexkv", instance=0) -> OracleHandle` (a host budget: the two-tier variant; another
    instance: another server of the same variant, for a fleet): each distinct variant is started
    once per session on free ports and stopped at the end. Its cache and log are shared by
    every test that asks for that variant: use keys of your own and look only at records you caused."""
    from tests.oracle.server import CONTROL_MODEL, MODEL_NAME

    started: dict[tuple, OracleHandle] = {}

    def get(cached_tokens: bool, budget_tokens: int = 0, page_tokens: int = 32,
            max_values: int = 40000, host_budget_tokens: int = 0, offload_mode: str = "flexkv",
            instance: int = 0) -> OracleHandle:
        variant = (cached_tokens, budget_tokens, page_tokens, max_values, host_budget_tokens, offload_mode, instance)
        if variant not in started:
            root = tmp_path_factory.mktemp("oracle")
            ports = Ports.free(cache_metrics=False)
            command = [sys.executable, "-m", "tests.oracle.server", "--grpc-port", str(ports.grpc),
                       "--http-port", str(ports.http), "--metrics-port", str(ports.metrics),
                       "--log", str(root / "requests.jsonl"), "--budget-tokens", str(budget_tokens),
                       "--page-tokens", str(page_tokens), "--max-values", str(max_values),
                       "--host-budget-tokens", str(host_budget_tokens), "--offload-mode", offload_mode]
            if cached_tokens:
                command.append("--cached-tokens")
            models = (MODEL_NAME, CONTROL_MODEL) if host_budget_tokens else (MODEL_NAME,)  # two tiers: a control model
            server = ServerProcess(command, root / "server.log", ports, models, ready_timeout_s=120.0, cwd=ROOT)
            started[variant] = OracleHandle(server.launch(), root / "requests.jsonl")
        return started[variant]

    yield get
    left = [f"{list(variant)}: {', '.join(t.left)}" for variant, handle in started.items()
            if not (t := handle.server.stop(30.0)).clean]
    assert not left, f"oracle processes left running: {left}"


pytest_plugins = ["tests.certs",  # `secure`: one TLS server per session, for tests/client and tests/loadtest
                  "tests.shards"]  # several pytest processes sharing one run (scripts/test.sh)


# ---------------------------------------------------------------------------------------------------------
# A fleet of reference servers (hstu_replay.fleet.local)

FLEET_SERVERS = 2
FLEET_BUDGET_TOKENS = 200_000  # no test of the fleet comes near it: nothing is evicted


def tree(pid: int) -> set[int]:
    """`pid` and every process below it, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo += parents.get(current, [])
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="session")
def fleet(compiled_repository, tmp_path_factory):
    """One fleet of two reference servers on CPU per test session, shared by every test of a fleet
    (a server's start costs seconds; each test makes cache keys of its own); at the end they are
    stopped and nothing of theirs may be left: no process of their trees (read from /proc before the stop) and no port they listened on."""
    from hstu_replay.fleet.local import LocalFleet

    fleet = LocalFleet(compiled_repository, FLEET_SERVERS, tmp_path_factory.mktemp("fleet"), FLEET_BUDGET_TOKENS,
                       ("--device", "cpu"), ready_timeout_s=240)
    fleet.start()
    yield fleet
    pids = set().union(*(tree(server.pid) for server in fleet.servers))
    ports = [port for server in fleet.servers for port in server.ports.all()]
    teardown = fleet.stop()
    assert teardown.clean, teardown.problems()
    assert [pid for pid in pids if alive(pid)] == []
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # connections closing there do not count
            sock.bind(("127.0.0.1", port))  # raises while something still listens there
