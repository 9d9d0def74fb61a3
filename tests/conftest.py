"""Shared fixtures: one compiled small target, one real tritonserver on loopback per test session.

Integration tests (marked `integration`) use the real server started here through
`hstu-replay target serve`, and real Locust processes through `run_locust`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hstu_replay.target.serve import free_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "datasets" / "sample"
LOCUSTFILE = ROOT / "locustfiles" / "hstu.py"
BIN = Path(sys.executable).parent




@dataclass(frozen=True)
class ServerHandle:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    cache_metrics_port: int
    log: Path

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"


def start_server(repository: Path, log: Path, *extra: str, ready_timeout: float = 120.0,
                 ports: tuple[int, int, int, int] | None = None) -> ServerHandle:
    http, grpc, metrics, cache_metrics = ports or free_ports(4)
    out = log.open("w")
    process = subprocess.Popen(
        [str(BIN / "hstu-replay"), "target", "serve", "--repository", str(repository), "--device", "cpu",
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
         "--cache-metrics-port", str(cache_metrics), *extra],
        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if "hstu-replay: serving" in log.read_text(errors="replace"):
            return ServerHandle(process, http, grpc, metrics, cache_metrics, log)
        if process.poll() is not None:
            break
        time.sleep(0.25)
    process.kill()
    raise RuntimeError(f"tritonserver did not become ready:\n{log.read_text(errors='replace')[-3000:]}")


def stop_server(server: ServerHandle, timeout: float = 60.0) -> int:
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(10)
        raise


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory) -> Path:
    from hstu_replay.data.prepare import prepare

    out = tmp_path_factory.mktemp("store") / "sample"
    prepare(SAMPLE, out)
    return out


@pytest.fixture(scope="session")
def compiled_repository(tmp_path_factory) -> Path:
    """The small config compiled with AOTInductor once per test session."""
    from hstu_replay.target.build import export_repository

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
def reference_dumps(compiled_repository, long_store, tmp_path_factory) -> Path:
    """Cold-cache reference dumps: batches of 8 users with 200..256 history items each."""
    from hstu_replay.target.build import load_engines
    from hstu_replay.target.dump import write_reference_dumps

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


def run_locust(report_dir: Path, *args: str, timeout: float = 180.0) -> LocustResult:
    """A real headless Locust run (bounded by `timeout`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        locust_command("--headless", "--only-summary", "--loglevel", "WARNING", "--report-dir", str(report_dir),
                       *args),
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env,
    )
    return LocustResult(proc.returncode, proc.stdout, proc.stderr, report_dir)
