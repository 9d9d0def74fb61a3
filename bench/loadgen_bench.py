"""Benchmark the load generator's own cost: client CPU per request, request rate, worker memory.

    python bench/loadgen_bench.py                     # ~3-4 minutes, after waiting (<= 10 min) for load < 1.2
    python bench/loadgen_bench.py --seconds 4 --locust-seconds 6 --max-load 0   # quick, no waiting

A do-nothing PyTriton model with the published KV-cache interface runs in a child process, so
its CPU is not the client's. Against it, one request in flight over gRPC, full-length KuaiRand
requests: B=8 users x (4096 history + 100 candidates), INPUT__0 = 67,184 int64 (537 KB).
1. In-process loops (CPU from getrusage(RUSAGE_SELF) deltas): our path (`build_request` +
   `TritonClient.infer`), our infer with the tensors reused, plain tritonclient with InferInputs
   reused (the toolchain notes' baseline), and our path under gevent with gRPC's gevent mode (a
   child process, as in a Locust worker); then cProfile over 200 requests, and the planning CPU
   of the workload sources.
2. Real headless Locust runs: locustfiles/hstu.py replaying the full-size store, and
   bench/locust_full_length.py (hstu.py with every request full-length), once more with glibc's
   malloc thresholds fixed (MALLOC_FIXED). Their CPU, page faults, request count and memory are
   sampled from /proc every 0.25 s; CPU per request is taken over the steady window (start-up
   and the final report left out).
Every reading also has the server's CPU and the machine's, so other tenants' load shows.
Results print as markdown tables; Locust reports and logs go to runs/loadgen-bench/.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import pstats
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hstu_replay.interface import KVCACHE, Limits  # noqa: E402
from hstu_replay.plan.step import PlannedStep  # noqa: E402
from hstu_replay.request import RequestTensors, UserRequest, build_request  # noqa: E402

from null_model import start_null  # noqa: E402

if TYPE_CHECKING:
    from hstu_replay.client.triton import TritonClient

BIN = Path(sys.executable).parent
OUT = ROOT / "runs" / "loadgen-bench"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BATCH, HISTORY, CANDIDATES = 8, 4096, 100
LIMITS = Limits(max_values=70_000)
#: perf_analyzer and plain tritonclient at this request size (/work/shared/reference/toolchain-notes.md)
#: glibc malloc with fixed thresholds: freed half-megabyte buffers stay in the heap for reuse
#: (both are needed: setting either one turns off glibc's dynamic threshold).
MALLOC_FIXED = (("MALLOC_MMAP_THRESHOLD_", str(8 << 20)), ("MALLOC_TRIM_THRESHOLD_", str(256 << 20)))
NOTES = (("perf_analyzer (C++), notes", 470.0, 0.37),
         ("tritonclient.grpc, InferInputs reused, notes", 510.0, 0.33),
         ("tritonclient.grpc, fresh inputs per request, notes", 330.0, 1.2))


# -- CPU, memory and load readings from /proc ------------------------------------------------

def own_cpu() -> tuple[float, float, int]:
    """(user s, system s, minor page faults) of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt


def _stat_fields(pid: int | str) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()


def process_cpu(pid: int) -> tuple[float, float, int]:
    """(user s, system s, minor page faults) of one process, all its threads."""
    fields = _stat_fields(pid)
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK, int(fields[7])


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its live descendants (the server: python, tritonserver, stubs)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        pid = int(path.split("/")[2])
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        parents[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += cpu.get(pid, 0.0)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return total


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks[:8]) - idle) / CLK_TCK


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon and RssFile of `pid`, in MB."""
    wanted = {"VmRSS", "VmHWM", "RssAnon", "RssFile"}
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in wanted:
                out[name] = int(value.split()[0]) / 1024
    return out


def load1() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 20.0) -> str:
    """Wait (bounded) until the 1-minute load average is below `max_load`; say what happened."""
    start = time.monotonic()
    while load1() >= max_load and time.monotonic() - start + poll_s <= max_wait_s:
        print(f"  waiting: 1-min load {load1():.2f} >= {max_load}", flush=True)
        time.sleep(poll_s)
    waited = time.monotonic() - start
    state = "below" if load1() < max_load else "STILL NOT below"
    return f"waited {waited:.0f} s; 1-min load {load1():.2f} ({state} {max_load})"


@dataclass(frozen=True)
class Reading:
    """One moment: wall clock, client CPU (user, sys) and minor faults, server-tree CPU, this
    observer's CPU when it is not the client, whole-machine busy CPU, 1-minute load average."""

    wall: float
    client_user: float
    client_sys: float
    client_minflt: float
    server_cpu: float
    observer_cpu: float
    machine_busy: float
    load: float

    @classmethod
    def take(cls, client: tuple[float, float, int], server_pid: int, observer: float = 0.0) -> Reading:
        return cls(time.time(), *client, tree_cpu_s(server_pid), observer, machine_busy_s(), load1())


@dataclass(frozen=True)
class Window:
    """What happened between two readings, over `requests` requests."""

    name: str
    requests: int
    first: Reading
    last: Reading
    p50_ms: float = float("nan")

    @classmethod
    def from_json(cls, data: dict) -> Window:
        return cls(data["name"], data["requests"], Reading(**data["first"]), Reading(**data["last"]),
                   data["p50_ms"])

    @property
    def seconds(self) -> float:
        return self.last.wall - self.first.wall

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def _delta(self, attr: str) -> float:
        return getattr(self.last, attr) - getattr(self.first, attr)

    @property
    def client_ms(self) -> float:
        return (self._delta("client_user") + self._delta("client_sys")) / self.requests * 1e3

    @property
    def client_sys_ms(self) -> float:
        return self._delta("client_sys") / self.requests * 1e3

    @property
    def minflt(self) -> float:
        return self._delta("client_minflt") / self.requests

    @property
    def server_ms(self) -> float:
        return self._delta("server_cpu") / self.requests * 1e3

    @property
    def other_cores(self) -> float:
        """Busy cores not explained by client, server or observer (other tenants of the machine)."""
        ours = sum(self._delta(a) for a in ("client_user", "client_sys", "server_cpu", "observer_cpu"))
        return (self._delta("machine_busy") - ours) / self.seconds

    @property
    def load(self) -> str:
        return f"{self.first.load:.2f} -> {self.last.load:.2f}"


# -- workload: full-length requests -------------------------------------------------------------

def cut_user(store, index: int, key: int) -> UserRequest:
    """Store user `index`: its first 4096 events as history, the next 100 as candidates."""
    history = store.user(index)
    return UserRequest(
        user_id=history.user_id, context=history.context,
        history_items=np.asarray(history.video_ids[:HISTORY], dtype=np.int64),
        history_actions=np.asarray(history.actions[:HISTORY], dtype=np.int64),
        candidates=np.asarray(history.video_ids[HISTORY:HISTORY + CANDIDATES], dtype=np.int64),
        cache_key=key,
    )


def long_users(store) -> list[int]:
    """Indexes of the users with at least 4096 + 100 events."""
    lengths = np.diff(np.asarray(store.offsets))
    return [int(i) for i in np.flatnonzero(lengths >= HISTORY + CANDIDATES)]


class FullLengthSource:
    """A workload source (see plan.sessions) whose every request is B full-length users, each
    cut afresh from the store with a fresh cache key; used by bench/locust_full_length.py."""

    def __init__(self, store, keys, candidates: int, limits: Limits):
        if candidates != CANDIDATES or limits.max_history != HISTORY:
            raise SystemExit(f"full-length runs take --candidates {CANDIDATES} --max-history {HISTORY}")
        self.store, self.keys, self.limits = store, keys, limits
        self.users = long_users(store)
        self._next = 0

    def next_step(self, target: float, batch_size: int | None = None) -> PlannedStep:
        batch = []
        for _ in range(batch_size or BATCH):
            batch.append(cut_user(self.store, self.users[self._next % len(self.users)], self.keys.new_key()))
            self._next += 1
        return PlannedStep(request=build_request(batch, self.limits), expected_hits=(0,) * len(batch),
                           label="full-length", target_ratio=target)

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        """Every key is fresh and used once: all retire."""
        return step.request.user_ids.tolist()

    def reset(self) -> None:
        """Nothing is kept."""


def full_length_users(store, count: int) -> list[UserRequest]:
    """`count` full-length users with distinct cache keys."""
    indexes = long_users(store)[:count]
    if len(indexes) < BATCH:
        raise SystemExit(f"the store has only {len(indexes)} users with {HISTORY + CANDIDATES} events")
    return [cut_user(store, index, key) for key, index in enumerate(indexes, 1)]


def batches(users: list[UserRequest]) -> Iterator[list[UserRequest]]:
    """Groups of BATCH users, rotating through the pool."""
    start = 0
    while True:
        yield [users[(start + i) % len(users)] for i in range(BATCH)]
        start += BATCH


# -- 1. our client path, one request in flight -------------------------------------------------

def measure_loop(name: str, send: Callable[[], None], seconds: float, max_requests: int,
                 server_pid: int, warmup: int = 20) -> Window:
    """Call `send` back to back until `max_requests` or `seconds`; CPU is this process's."""
    for _ in range(warmup):
        send()
    latencies = []
    first = Reading.take(own_cpu(), server_pid)
    deadline = time.perf_counter() + seconds
    while len(latencies) < max_requests and time.perf_counter() < deadline:
        start = time.perf_counter()
        send()
        latencies.append(time.perf_counter() - start)
    last = Reading.take(own_cpu(), server_pid)
    return Window(name, len(latencies), first, last, float(np.median(latencies) * 1e3))


def raw_tritonclient_sender(url: str, tensors: RequestTensors) -> tuple[Callable[[], None], Callable[[], None]]:
    """tritonclient.grpc with InferInput objects built once and reused: the notes' baseline."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    inputs = []
    for name, array in tensors.inputs(KVCACHE).items():
        item = grpcclient.InferInput(name, list(array.shape), "INT64")
        item.set_data_from_numpy(array)
        inputs.append(item)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT__0")]

    def send() -> None:
        client.infer(KVCACHE.model_name, inputs, outputs=outputs).as_numpy("OUTPUT__0")

    return send, client.close


def our_client(url: str) -> TritonClient:
    """Our client, connected (interface detected), with default options: gRPC, no TLS."""
    from hstu_replay.client.triton import ClientOptions, TritonClient

    client = TritonClient(ClientOptions(url=url))
    client.connect()
    return client


def merge(windows: list[Window]) -> Window:
    """One window from several runs of the same loop: deltas added, p50 the median of theirs."""
    names = [f.name for f in fields(Reading) if f.name != "load"]
    total = {n: sum(getattr(w.last, n) - getattr(w.first, n) for w in windows) for n in names}
    first = Reading(**dict.fromkeys(names, 0.0), load=windows[0].first.load)
    last = Reading(**total, load=windows[-1].last.load)
    return Window(windows[0].name, sum(w.requests for w in windows), first, last,
                  float(np.median([w.p50_ms for w in windows])))


def client_windows(url: str, users: list[UserRequest], args: argparse.Namespace, server_pid: int) -> list[Window]:
    """In this process: our full path, our infer alone, raw tritonclient with reused inputs;
    interleaved in `args.rounds` rounds so a change in background load hits all three alike."""
    client, groups = our_client(url), batches(users)
    fixed = build_request(next(groups), LIMITS)
    raw_send, raw_close = raw_tritonclient_sender(url, fixed)
    loops = [("build_request + TritonClient.infer (our path)", lambda: client.infer(build_request(next(groups), LIMITS))),
             ("TritonClient.infer, RequestTensors reused", lambda: client.infer(fixed)),
             ("tritonclient.grpc, InferInputs reused", raw_send)]
    seconds, requests = args.seconds / args.rounds, max(1, args.max_requests // args.rounds)
    try:
        rounds = [[measure_loop(name, send, seconds, requests, server_pid) for name, send in loops]
                  for _ in range(args.rounds)]
    finally:
        client.close()
        raw_close()
    return [merge(list(same)) for same in zip(*rounds)]


def gevent_loop(url: str, server_pid: int, seconds: float, max_requests: int, store_dir: str) -> None:
    """Child process: our path with gevent patched in and gRPC's gevent mode, as in a Locust worker.

    Prints the window as JSON and leaves with os._exit: a gRPC channel under gevent can hang
    interpreter teardown (toolchain notes).
    """
    from gevent import monkey

    monkey.patch_all()
    from grpc.experimental import gevent as grpc_gevent

    grpc_gevent.init_gevent()
    from hstu_replay.data.store import SequenceStore

    client, groups = our_client(url), batches(full_length_users(SequenceStore.open(store_dir), 64))
    window = measure_loop("build_request + TritonClient.infer under gevent + grpc init_gevent",
                          lambda: client.infer(build_request(next(groups), LIMITS)), seconds, max_requests, server_pid)
    print(json.dumps(asdict(window)), flush=True)
    os._exit(0)


def run_gevent_loop(url: str, server_pid: int, args: argparse.Namespace, store_dir: Path) -> Window | None:
    """Run `gevent_loop` in a child process (bounded); None, with a line on stderr, if it fails."""
    command = [sys.executable, __file__, "--gevent-loop", url, str(server_pid), str(args.seconds),
               str(args.max_requests), "--store", str(store_dir)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 120, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print("gevent loop: timed out", file=sys.stderr)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        print(f"gevent loop failed (exit {done.returncode}): {done.stderr[-800:]}", file=sys.stderr)
        return None
    return Window.from_json(json.loads(lines[-1]))


def profile_client(url: str, users: list[UserRequest], requests: int = 200, top: int = 8) -> list[list]:
    """cProfile of our path over `requests` requests: the `top` functions by cumulative time."""
    client, groups = our_client(url), batches(users)
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        for _ in range(requests):
            client.infer(build_request(next(groups), LIMITS))
        profiler.disable()
    finally:
        client.close()
    rows = [[_where(func), calls, tottime, cumtime]
            for func, (_, calls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items()
            if func[0] != __file__]
    rows.sort(key=lambda r: -r[3])
    return rows[:top]


def _where(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name.replace("|", "/")
    short = path.split("site-packages/")[-1].replace(str(ROOT) + "/", "")
    return f"{short}:{line}({name})"


def planning_costs(store, steps: int = 300) -> list[list]:
    """CPU per step of the workload sources (plan + build_request), no server: what a Locust
    user spends per request before the client is called."""
    from hstu_replay.plan.dealer import Dealer
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.sessions import SessionSource, usable_users

    dealer = Dealer(usable_users(store, CANDIDATES), seed=0)  # as a Locust process does with --replay-seed 0
    rows = []
    for name, ratio, source in (
        ("SessionSource, h=1.0", 1.0, SessionSource(store, dealer, KeyAllocator(0, 0), CANDIDATES, LIMITS)),
        ("SessionSource, h=0.5", 0.5, SessionSource(store, dealer, KeyAllocator(0, 1), CANDIDATES, LIMITS)),
        ("SessionSource, h=0", 0.0, SessionSource(store, dealer, KeyAllocator(0, 2), CANDIDATES, LIMITS)),
        ("FullLengthSource (bench)", 0.0, FullLengthSource(store, KeyAllocator(0, 3), CANDIDATES, LIMITS)),
    ):
        for _ in range(20):
            source.settle(source.next_step(ratio, BATCH), True)
        sizes, start = [], time.process_time()
        for _ in range(steps):
            step = source.next_step(ratio, BATCH)
            source.settle(step, True)
            sizes.append(len(step.request.values) + (len(step.prime.values) if step.prime is not None else 0))
        cpu_ms = (time.process_time() - start) / steps * 1e3
        rows.append([name, steps, float(np.mean(sizes)), cpu_ms])
    return rows


# -- 2. real Locust runs --------------------------------------------------------------------------

@dataclass(frozen=True)
class LocustCase:
    name: str
    slug: str  # report folder under runs/loadgen-bench/
    locustfile: Path
    hit_ratio: str
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the Locust process


class RecordCounter:
    """Counts lines of the records file a Locust run appends to, incrementally."""

    def __init__(self, directory: Path):
        self.directory, self.count, self._file = directory, 0, None

    def read(self) -> int:
        if self._file is None:
            found = sorted(self.directory.glob("records-*.jsonl"))
            if not found:
                return 0
            self._file = found[0].open("rb")
        self.count += self._file.read().count(b"\n")
        return self.count

    def close(self) -> None:
        if self._file:
            self._file.close()


@dataclass
class Sample:
    reading: Reading
    records: int
    memory: dict[str, float]


@dataclass
class LocustResult:
    case: LocustCase
    command: list[str]
    returncode: int
    samples: list[Sample]
    total_cpu_s: float  # whole process, start-up and final report included (wait4's rusage)
    report: dict = field(default_factory=dict)
    records: list[dict] = field(default_factory=list)
    killed: bool = False  # still running at the deadline, so killed here

    @property
    def exit(self) -> str:
        if not self.killed:
            return str(self.returncode)
        state = "report written, hung at exit" if self.report else "no report"
        return f"{self.returncode} (killed at the deadline; {state})"

    def window(self) -> Window:
        """Steady state: 1 s after the first record to 0.5 s before the last new one."""
        with_records = [s for s in self.samples if s.records > 0]
        if not with_records:
            raise SystemExit(f"{self.case.name}: no request was recorded (exit {self.returncode})")
        last_change = max(i for i, s in enumerate(self.samples) if i and s.records > self.samples[i - 1].records)
        begin = with_records[0].reading.wall + 1.0
        end = self.samples[last_change].reading.wall - 0.5
        inside = [s for s in self.samples if begin <= s.reading.wall <= end] or with_records
        first, last = inside[0], inside[-1]
        return Window(self.case.name, last.records - first.records, first.reading, last.reading)

    def _in(self, window: Window) -> list[dict]:
        """Records of the requests that ended inside `window`."""
        return [r for r in self.records if window.first.wall <= r["t"] + r["latency_ms"] / 1e3 <= window.last.wall]

    def mean_values(self, window: Window) -> float:
        """Mean len(INPUT__0) of the window's requests (primes carry 1 candidate per user)."""
        sizes = [r["tokens"] + 2 * r["batch"] * (1 if r["kind"] == "prime" else CANDIDATES) for r in self._in(window)]
        return float(np.mean(sizes)) if sizes else float("nan")

    def kinds(self, window: Window) -> str:
        counts: dict[str, int] = {}
        for r in self._in(window):
            counts[r["kind"]] = counts.get(r["kind"], 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))

    def peak(self, key: str) -> float:
        return max((s.memory.get(key, 0.0) for s in self.samples), default=float("nan"))


def locust_command(case: LocustCase, url: str, store: Path, report_dir: Path, seconds: float) -> list[str]:
    """One user, B=8, full-length limits, one stage of `seconds` after a 2 s warm-up."""
    return [str(BIN / "locust"), "-f", str(case.locustfile.relative_to(ROOT)), "--headless", "--only-summary",
            "--loglevel", "WARNING", "-u", "1", "-r", "1", "--triton-url", url, "--workload", "sessions",
            "--store", str(store), "--hit-ratios", case.hit_ratio, "--batch-sizes", str(BATCH),
            "--max-history", str(HISTORY), "--max-values", str(LIMITS.max_values),
            "--candidates", str(CANDIDATES), "--stage-seconds", f"{seconds:g}", "--warmup-seconds", "2",
            "--report-dir", str(report_dir)]


def _relative(path: Path) -> Path:
    """`path` relative to the repository when inside it (shorter printed commands)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def run_locust(case: LocustCase, url: str, store: Path, seconds: float, server_pid: int,
               period_s: float = 0.25) -> LocustResult:
    """One headless Locust process, sampled every `period_s` from /proc until it exits (bounded)."""
    from hstu_replay.loadtest.records import read_records

    report_dir = OUT / case.slug
    report_dir.mkdir(parents=True, exist_ok=True)
    for old in report_dir.iterdir():
        old.unlink()
    command = locust_command(case, url, _relative(store), _relative(report_dir), seconds)
    counter, samples, usage, status = RecordCounter(report_dir), [], None, 0
    with (report_dir / "locust.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=dict(os.environ, PYTHONUNBUFFERED="1", **dict(case.env)))
        deadline = time.monotonic() + seconds + 45  # start-up, 2 s warm-up, reports: ~15 s
        try:
            while time.monotonic() < deadline:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                usage = None
                try:
                    reading = Reading.take(process_cpu(process.pid), server_pid, sum(own_cpu()[:2]))
                    samples.append(Sample(reading, counter.read(), memory_mb(process.pid)))
                except (OSError, ValueError, IndexError):  # exiting between wait4 and the reads
                    pass
                time.sleep(period_s)
        finally:
            counter.close()
            killed = usage is None  # deadline passed (a hang at exit) or interrupted
            if killed:
                process.kill()
                _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    report = report_dir / "report.json"
    return LocustResult(case, command, process.returncode, samples, usage.ru_utime + usage.ru_stime,
                        json.loads(report.read_text()) if report.is_file() else {}, read_records(report_dir),
                        killed)


# -- store, output, main ----------------------------------------------------------------------

def ensure_store(store: Path) -> None:
    """Generate the full-size synthetic store when it is missing (~1 minute)."""
    if (store / "meta.json").is_file():
        return
    raw, tool = store.parent / "raw-full", str(BIN / "hstu-replay")
    print(f"generating {store} (synthetic, full size) ...", flush=True)
    subprocess.run([tool, "data", "synth", "--out", str(raw), "--full", "--seed", "1"], check=True, timeout=600)
    subprocess.run([tool, "data", "prepare", str(raw), "--out", str(store)], check=True, timeout=600)


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table; floats get 3 decimals below 10, none above."""
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows])


def client_table(windows: list[Window]) -> str:
    """Table 1a: the client loops."""
    rows = [[w.name, w.requests, w.rps, w.p50_ms, w.client_ms, w.client_sys_ms, w.minflt, 1e3 / w.client_ms,
             w.server_ms, w.other_cores, w.load] for w in windows]
    return table(["client path", "requests", "req/s", "p50 ms", "client CPU ms/req", "of which sys",
                  "minor faults/req", "CPU-bound ceiling req/s (1 core)", "server CPU ms/req", "other busy cores",
                  "1-min load"], rows)


def locust_table(results: list[LocustResult]) -> str:
    """Table 1d: the Locust runs, over their steady windows."""
    rows = []
    for r in results:
        w = r.window()
        measured = (r.report.get("bins") or [{}])[0]
        total = len(r.records)
        rows.append([r.case.name, r.exit, r.mean_values(w), f"{w.requests} ({r.kinds(w)})", w.rps,
                     measured.get("throughput_rps", float("nan")), measured.get("p50_ms", float("nan")),
                     w.client_ms, w.client_sys_ms, w.minflt, 1e3 / w.client_ms,
                     r.total_cpu_s / total * 1e3 if total else float("nan"), w.server_ms, w.other_cores, w.load])
    return table(["Locust run (1 user, B=8)", "exit", "mean len(INPUT__0)", "requests in window",
                  "req/s (window, all kinds)", "report.json req/s (measured bin)", "report.json p50 ms",
                  "Locust CPU ms/req (window)", "of which sys", "minor faults/req", "CPU-bound ceiling req/s (1 core)",
                  "CPU ms/req (whole process)", "server CPU ms/req", "other busy cores", "1-min load"], rows)


def memory_table(results: list[LocustResult], store: Path) -> str:
    """Table 2: resident memory of each Locust process."""
    on_disk = sum(p.stat().st_size for p in store.glob("*.npy")) / 2**20
    rows = [[r.case.name, r.peak("VmRSS"), r.peak("VmHWM"), r.peak("RssAnon"), r.peak("RssFile"), on_disk,
             "yes" if max(r.peak("VmRSS"), r.peak("VmHWM")) < 1024 else "NO"] for r in results]
    return table(["Locust process", "peak VmRSS MB (0.25 s samples)", "peak VmHWM MB", "peak RssAnon MB",
                  "peak RssFile MB", "store .npy on disk MB", "under 1 GB"], rows)


def comparison_table(windows: list[Window], full_locust: list[LocustResult]) -> str:
    rows = [[name, rps, cpu, 1e3 / cpu] for name, rps, cpu in NOTES]
    rows += [[w.name + ", here", w.rps, w.client_ms, 1e3 / w.client_ms] for w in windows]
    for result in full_locust:
        w = result.window()
        rows.append([result.case.name + ", here", w.rps, w.client_ms, 1e3 / w.client_ms])
    return table(["full-length request (B=8, 67,184 values), gRPC, 1 in flight", "req/s", "client CPU ms/req",
                  "CPU-bound ceiling req/s (1 core)"], rows)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=ROOT / "runs" / "store-full")
    parser.add_argument("--seconds", type=float, default=12.0, help="bound of each in-process loop, s")
    parser.add_argument("--max-requests", type=int, default=3000, help="bound of each in-process loop")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the in-process loops")
    parser.add_argument("--locust-seconds", type=float, default=20.0, help="measured seconds per Locust run")
    parser.add_argument("--max-load", type=float, default=1.2, help="first wait for the 1-min load below this (0: no)")
    parser.add_argument("--max-wait", type=float, default=600.0, help="longest wait for a quiet machine, s")
    parser.add_argument("--gevent-loop", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.gevent_loop:
        url, pid, seconds, requests = args.gevent_loop
        gevent_loop(url, int(pid), float(seconds), int(requests), str(args.store))
    started = time.monotonic()
    print(f"command: {shlex.join(['python', *sys.argv])}  (cwd {ROOT}, {os.cpu_count()} cores)", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    store_dir = args.store.resolve()
    ensure_store(store_dir)
    from hstu_replay.data.store import SequenceStore

    store = SequenceStore.open(store_dir)
    print(f"store: {store_dir} ({store.num_users:,} users, {store.num_events:,} events)")
    users = full_length_users(store, 64)
    if args.max_load > 0:
        print("before measuring: " + wait_for_quiet(args.max_load, args.max_wait), flush=True)
    measuring = time.monotonic()
    server = start_null(KVCACHE, OUT / "dummy-server.log")
    try:
        pid = server.process.pid
        windows = client_windows(server.url, users, args, pid)
        gevent_window = run_gevent_loop(server.url, pid, args, store_dir)
        windows += [gevent_window] if gevent_window else []
        profile = profile_client(server.url, users)
        hstu, full = ROOT / "locustfiles" / "hstu.py", ROOT / "bench" / "locust_full_length.py"
        cases = [LocustCase("hstu.py sessions, h=1.0", "sessions-h1.0", hstu, "1.0"),
                 LocustCase("hstu.py sessions, h=0.5", "sessions-h0.5", hstu, "0.5"),
                 LocustCase("bench/locust_full_length.py, h=0", "full-length", full, "0"),
                 LocustCase("bench/locust_full_length.py, h=0, malloc thresholds fixed", "full-length-malloc",
                            full, "0", MALLOC_FIXED)]
        results = [run_locust(c, server.url, store_dir, args.locust_seconds, pid) for c in cases]
    finally:
        server.stop()
    planning = planning_costs(store)

    print("\n### 1a. Client CPU per request, full-length requests (B=8 x (4096+100), 67,184 values, 537 KB)\n")
    print(client_table(windows))
    print("\n### 1b. cProfile of our path (build_request + TritonClient.infer), 200 requests, "
          "top 8 by cumulative time (wall clock)\n")
    print(table(["function", "calls", "tottime s", "cumtime s"], profile))
    print("\n### 1c. Planning CPU per request before the client is called (no server; prime included)\n")
    print(table(["workload source, B=8", "steps", "mean len(INPUT__0) sent per step", "CPU ms/step"], planning))
    print("\n### 1d. Real headless Locust runs against the do-nothing model\n")
    print(locust_table(results))
    print()
    for r in results:
        env = "".join(f"{k}={v} " for k, v in r.case.env)
        print(f"- {r.case.name}: `{env}{shlex.join(r.command)}`")
    print("\n### 2. Locust process memory while replaying the full-size store\n")
    print(memory_table(results, store_dir))
    print("\n### Comparison with toolchain-notes.md (perf_analyzer on the same request size)\n")
    print(comparison_table(windows, results[2:]))
    print(f"\nmeasuring took {time.monotonic() - measuring:.0f} s; whole run {time.monotonic() - started:.0f} s; "
          f"1-min load now {load1():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
