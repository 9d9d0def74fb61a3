"""What the client benchmarks share: child servers, perf_analyzer, Locust runs, process readings, tables.

Every figure of a process's cost is read through `hstu_replay.inspection` (user and system CPU,
minor page faults: all threads) over a steady window, and every request count from the server's own
statistics (`/v2/models/<model>/stats`, successes), so that a client that claims requests it
did not send cannot look cheap. A window opens `warm_s` after the server saw the client's
first request and closes `seconds` later; the client is stopped after it.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from hstu_replay.inspection import ProcTimes, load_average, rss_mib
from hstu_replay.interface import ModelInterface
from hstu_replay.loadtest.command import locust_command
from hstu_replay.process import Child, Ports, ServerProcess, Stopping, log_reason

ROOT = Path(__file__).resolve().parents[1]
PA_DIR = ROOT / "runs" / "perf_analyzer"
PA_BIN = PA_DIR / "perf_analyzer"
PA_WHEEL = "tritonclient==2.51.0"


class Unavailable(Exception):
    """A part the benchmark needs cannot be had here (one line)."""


# -- servers ------------------------------------------------------------------------------------

def start_null(interface: ModelInterface, log: Path, instances: int = 1, timeout_s: float = 120.0,
               extra: Sequence[str] = ()) -> ServerProcess:
    """The do-nothing model of `interface` (`instances` copies) in a child process on free ports,
    started and ready; `extra`: more of null_model.py's arguments (TLS)."""
    ports = Ports.free(cache_metrics=False)
    command = [sys.executable, "-m", "bench.null_model", interface.model_name, str(ports.grpc), str(ports.http),
               str(ports.metrics), "--instances", str(instances), *extra]
    return ServerProcess(command, log, ports, (interface.model_name,), ready_timeout_s=timeout_s, cwd=ROOT).launch()


def successes(server: ServerProcess | Sequence[ServerProcess], model: str) -> int:
    """Requests the server (or every server of a sequence) has answered successfully so far (its
    statistics, over HTTP)."""
    if isinstance(server, Sequence):
        return sum(successes(one, model) for one in server)
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as reply:
        stats = json.load(reply)
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


# -- readings -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """A client process over a steady window: its CPU and faults, and what the server answered."""

    requests: int
    seconds: float
    user_s: float
    system_s: float
    minor_faults: int
    rss_mib: float = float("nan")  # the client's resident memory at the window's end

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else float("nan")

    @property
    def cpu_ms(self) -> float:
        """Client CPU (user + system) per request, ms."""
        return 1e3 * (self.user_s + self.system_s) / self.requests if self.requests else float("nan")

    @property
    def system_ms(self) -> float:
        return 1e3 * self.system_s / self.requests if self.requests else float("nan")

    @property
    def faults(self) -> float:
        return self.minor_faults / self.requests if self.requests else float("nan")

    @property
    def cores(self) -> float:
        """Cores the client kept busy on average."""
        return (self.user_s + self.system_s) / self.seconds if self.seconds else float("nan")


def machine_load() -> str:
    """The host's load averages over 1, 5 and 15 minutes, as /proc/loadavg writes them."""
    return " ".join(f"{value:.2f}" for value in load_average())


def client(command: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
           stop_signal: int = signal.SIGINT) -> Child:
    """A client benchmark's child (a Locust run, perf_analyzer), started: its output in `log`, asked
    to stop by `stop_signal` (Locust writes its report on SIGINT), killed with its session if it hangs."""
    child = Child(command, log, name="the client", cwd=ROOT, env=env, stopping=Stopping(stop_signal))
    child.start()
    return child


def measure(command: Sequence[str], server: ServerProcess, model: str, log: Path, seconds: float,
            warm_s: float = 2.0, start_timeout_s: float = 120.0, env: dict[str, str] | None = None,
            stop_signal: int = signal.SIGINT) -> Window:
    """Run `command` (a client) and read one steady window of it; the client is stopped after."""
    process = client(command, log, env, stop_signal)
    try:
        wait_for_load(server, model, process, start_timeout_s)
        time.sleep(warm_s)
        (window,) = read_windows(server, model, [process], seconds)
        if not process.running:
            raise SystemExit(f"client ended inside its window; make its run longer; see {log}")
        return window
    finally:
        process.stop()


def wait_for_load(server: ServerProcess, model: str, process: Child, timeout_s: float) -> None:
    """Until the server has answered a request more (bounded; exit with one line if `process` ends first)."""
    begin, deadline = successes(server, model), time.monotonic() + timeout_s
    while successes(server, model) == begin:
        if not process.running or time.monotonic() > deadline:
            raise SystemExit(f"no requests reached the server{log_reason(process.log)}")
        time.sleep(0.05)


def read_windows(server: ServerProcess, model: str, processes: Sequence[Child], seconds: float) -> list[Window]:
    """One window of `seconds`, for each process: its CPU and faults, with the server's count of
    the requests all of them sent in it."""
    t0, n0, c0 = time.monotonic(), successes(server, model), [ProcTimes.of(p.pid) for p in processes]
    time.sleep(seconds)
    t1, n1, c1 = time.monotonic(), successes(server, model), [ProcTimes.of(p.pid) for p in processes]
    return [Window(n1 - n0, t1 - t0, b.user_s - a.user_s, b.system_s - a.system_s, b.minor_faults - a.minor_faults,
                   rss_mib(p.pid)) for a, b, p in zip(c0, c1, processes)]


class MemoryPeaks:
    """The largest resident memory seen, sample by sample (`sample`, e.g. as `Child.wait`'s `each`):
    of one process and its anonymous part (its own heap, not the file pages it maps, such as a
    store's), and of the whole tree under a root pid added up."""

    def __init__(self, root: int, process: int | None = None):
        self.root, self.process = root, root if process is None else process
        self.tree_mib = self.process_mib = self.process_anon_mib = 0.0

    def sample(self) -> None:
        try:
            tree = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
        except psutil.Error:
            return
        total = 0
        for p in tree:
            try:
                info = p.memory_info()
            except psutil.Error:
                continue
            total += info.rss
            if p.pid == self.process:
                self.process_mib = max(self.process_mib, info.rss / 2**20)
                self.process_anon_mib = max(self.process_anon_mib, (info.rss - info.shared) / 2**20)
        self.tree_mib = max(self.tree_mib, total / 2**20)


# -- the two clients ----------------------------------------------------------------------------

def replay_command(url: str, protocol: str, dump_dir: Path, report_dir: Path, seconds: float,
                   *extra: str, users: int = 1, batch: int = 8, max_values: int = 70_000) -> list[str]:
    """The product path: `locust -f locustfiles/hstu.py` headless, replaying dumps at hit ratio 0."""
    return workload_command(url, protocol, ("--workload", "dumps", "--dump-dir", str(dump_dir), "--hit-ratios", "0"),
                            report_dir, seconds, *extra, users=users, batch=batch, max_values=max_values)


def workload_command(url: str, protocol: str, workload: Sequence[str], report_dir: Path, seconds: float,
                     *extra: str, users: int = 1, batch: int = 8, max_values: int = 70_000) -> list[str]:
    """`locust -f locustfiles/hstu.py` headless, one stage of `seconds` of the `workload` arguments
    (--workload and its data, hit ratios)."""
    return locust_command("--headless", "-u", str(users), "-r", str(users),
                          "-t", f"{int(seconds) + 30}s", "--stage-seconds", str(seconds), "--warmup-seconds", "1",
                          *workload, "--max-values", str(max_values), "--batch-sizes", str(batch), "--triton-url", url,
                          "--triton-protocol", protocol, "--report-dir", str(report_dir), "--only-summary", *extra)


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _find_library(pattern: str) -> Path:
    sp = _site_packages()
    for folder in (sp / "pytriton", sp / "nvidia_pytriton.libs"):
        hits = sorted(glob.glob(str(folder / "**" / pattern), recursive=True))
        if hits:
            return Path(hits[0])
    raise Unavailable(f"no {pattern} under {sp}/pytriton or nvidia_pytriton.libs (install the target extra)")


def perf_analyzer_env() -> dict[str, str]:
    """Download and unpack perf_analyzer 2.51 once (the tritonclient 2.51.0 wheel carries it, with
    its libraries taken from the nvidia-pytriton wheel); returns the environment it runs with."""
    lib = PA_DIR / "lib"
    if not PA_BIN.exists():
        wheels = PA_DIR / "whl"
        found = sorted(wheels.glob("tritonclient-2.51.0-*.whl"))
        if not found:
            try:
                done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", PA_WHEEL, "-d",
                                       str(wheels)], capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                raise Unavailable(f"pip download {PA_WHEEL} took over 300 s") from None
            found = sorted(wheels.glob("tritonclient-2.51.0-*.whl"))
            if done.returncode or not found:
                tail = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise Unavailable(f"pip download {PA_WHEEL} failed: {tail}")
        with zipfile.ZipFile(found[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/bin/perf_analyzer")), None)
            if member is None:
                raise Unavailable(f"{found[0].name} has no bin/perf_analyzer")
            PA_DIR.mkdir(parents=True, exist_ok=True)
            PA_BIN.write_bytes(wheel.read(member))
        PA_BIN.chmod(0o755)
    lib.mkdir(parents=True, exist_ok=True)
    for soname, pattern in (("libb64.so.0d", "libb64*.so.0d"), ("libcudart.so.12", "libcudart*.so.12*")):
        link = lib / soname
        if not link.exists():
            link.unlink(missing_ok=True)  # a dangling link from another venv
            link.symlink_to(_find_library(pattern))
    env = dict(os.environ, LD_LIBRARY_PATH=f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":"))
    try:
        probe = subprocess.run([str(PA_BIN), "--version"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"{PA_BIN} does not start: {exc}") from None
    if probe.returncode != 0 or "analyzer" not in (probe.stdout + probe.stderr).lower():
        tail = ((probe.stderr or probe.stdout).strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        raise Unavailable(f"{PA_BIN} does not run here: {tail}")
    return env


def perf_analyzer_command(url: str, protocol: str, model: str, trace: Path, stable: bool = False) -> list[str]:
    """perf_analyzer at concurrency 1 over `trace` (its --input-data): one long window to be read
    from outside (harness.measure), or `stable`: its own 3 s windows until three agree within 10%."""
    windows = ["-p", "3000", "-r", "10", "-s", "10"] if stable else ["-p", "120000", "-r", "1", "-s", "100"]
    return [str(PA_BIN), "-m", model, "-u", url, "-i", protocol, "--input-data", str(trace),
            "--concurrency-range", "1", *windows]


# -- output -------------------------------------------------------------------------------------

def table(header: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
        return f"{value:,}" if isinstance(value, int) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def this_command() -> str:
    """The command line that ran this benchmark, as given from the repository root."""
    return "python -m " + shlex.join([f"bench.{Path(sys.argv[0]).stem}", *sys.argv[1:]])


# -- requests -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """B users x (history items + candidates): the size of every request of a benchmark."""

    batch: int
    history: int
    candidates: int

    @property
    def name(self) -> str:
        return f"{self.batch} x ({self.history:,} + {self.candidates})"

    @property
    def values(self) -> int:
        return self.batch * (6 + 2 * (self.history + self.candidates))


def shape_dumps(shape: Shape, directory: Path, batches: int = 16, seed: int = 0) -> list:
    """NVIDIA-format dump batches of `shape` (KuaiRand-like ids; reference logits all zero, what
    the do-nothing model answers), written once; returns the same requests as RequestTensors
    (user ids as keys) for a perf_analyzer trace."""
    import numpy as np

    from hstu_replay.interface import FEATURE_KEYS, Limits
    from hstu_replay.request import UserRequest, build_request

    rng = np.random.default_rng(seed)
    requests = []
    for b in range(batches):
        users = [UserRequest(1 + b * shape.batch + u, tuple(int(x) for x in rng.integers(1, 8, 5)),
                             rng.integers(1, 4_400_000, shape.history), rng.integers(0, 256, shape.history),
                             rng.integers(1, 4_400_000, shape.candidates)) for u in range(shape.batch)]
        requests.append(build_request(users, Limits(max_values=max(shape.values, 40_000))))
    done = directory / "complete"
    if not done.exists():
        from hstu_replay.dumps.writer import write_dump_batch, write_feature_keys

        write_feature_keys(directory, FEATURE_KEYS)
        for b, r in enumerate(requests):
            write_dump_batch(directory, b, {"values": r.values, "lengths": r.lengths,
                                            "num_candidates": r.num_candidates,
                                            "compiled_logits": np.zeros((r.num_logits, 8), np.float32)})
        done.write_text("ok\n")
    return requests


def perf_analyzer_trace(requests: list, interface: ModelInterface, path: Path) -> Path:
    from hstu_replay.plan.perf_analyzer import TraceEntry, write_trace

    if not path.exists():
        write_trace((TraceEntry(r, False) for r in requests), interface, path)
    return path


def workload_trace(workload: str, options, ratio: float, batch: int, requests: int, interface: ModelInterface,
                   path: Path) -> Path:
    """`requests` measured requests of `workload` (a `plan.workloads` name, `WorkloadOptions`),
    primes included in send order, as a perf_analyzer trace: the requests our worker sends."""
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.perf_analyzer import plan_trace, write_trace
    from hstu_replay.plan.workloads import open_workload

    if not path.exists():
        opened = open_workload(workload, options)
        opened.check((batch,))
        write_trace(plan_trace(opened.source(KeyAllocator(0, 0, 1)), interface, ratio, batch, requests), interface,
                    path)
    return path


def synthetic_store(directory: Path, users: int = 1000, scale: float = 0.4, seed: int = 5) -> Path:
    """A prepared store of synthetic KuaiRand-schema users (about 4,700 events each at the
    defaults: long enough for full histories, enough users for a natural replay), made once."""
    if not (directory / "meta.json").exists():
        raw = directory.with_name(directory.name + "-raw")
        for command in (["data", "synth", "--out", str(raw), "--users", str(users), "--scale", str(scale),
                         "--seed", str(seed)], ["data", "prepare", str(raw), "--out", str(directory)]):
            subprocess.run([sys.executable, "-m", "hstu_replay.cli", *command], check=True, capture_output=True,
                           timeout=600, cwd=ROOT)
        for f in raw.glob("*"):
            f.unlink()
        raw.rmdir()
    return directory


def measured_child(command: Sequence[str], log: Path, timeout_s: float = 7200.0) -> dict:
    """Run a worker child to its end; the JSON object it printed last (its own time and peak RSS).
    A failure or a time-out ends the benchmark with the child's last log line."""
    child = Child(command, log, name=shlex.join(command[2:5]), cwd=ROOT)
    child.start()
    try:
        if not child.wait(timeout_s):
            raise SystemExit(f"{child.name}: still running after {timeout_s:.0f} s")
    finally:
        child.stop()
    if child.exited() != "exit 0":
        raise SystemExit(child.failure())
    return json.loads(log.read_text().strip().splitlines()[-1])


def report_bin(report_dir: Path) -> dict:
    """The one measured stage of a Locust run's report."""
    with (report_dir / "report.json").open() as f:
        bins = json.load(f)["bins"]
    if len(bins) != 1:
        raise SystemExit(f"{report_dir}/report.json has {len(bins)} stages; expected 1")
    return bins[0]
