"""Latency of the reference target against the cached fraction of the history.

    python bench/target_latency_bench.py                         # small config, CPU, both modes
    python bench/target_latency_bench.py --repeats 5 --batches 1 # a quick run
    python bench/target_latency_bench.py --engine batched --config kuairand-1k --dtype bfloat16 \
        --device cuda --history 4096 --candidates 100 --batches 1,2,8   # the GPU figures

For each cached fraction f of a history of m items, a fresh cache key is primed with a prefix of
p items (6 + 2p ~= f * (6 + 2m); f = 0: no prime), then the full m-item request with the same key
is timed. Every repetition uses fresh keys, so each measurement is exactly at f; the cache is
emptied after each repetition (untimed) so memory stays flat. Two modes:

- in-process: `load_engines(...).cached.infer(tensors)` in this interpreter;
- triton: a real `hstu-replay server serve` subprocess on 127.0.0.1 (free ports), driven by
  `tritonclient.grpc` with one request in flight; the server's CACHED_TOKENS are checked.

Fractions are interleaved within each repetition so slow drift (other load) hits them all alike.
Each (mode, batch) stops early when `--budget-s` is spent (the table's n says how many ran), and
the 1-minute load average is sampled around each mode: the model's OpenMP threads are very
sensitive to other work on the same cores.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hstu_replay.interface import KVCACHE, Limits, history_tokens  # noqa: E402
from hstu_replay.plan.reuse import prime_items  # noqa: E402
from hstu_replay.request import RequestTensors, UserRequest, build_request  # noqa: E402
from hstu_replay.server.serve import free_ports  # noqa: E402

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
WARMUP_REQUESTS = 3  # untimed full requests per batch size and mode
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
BIN = Path(sys.executable).parent

#: The published package takes at most 40,000 values a request; 8 users x 4096 items need ~67,000.
LIMITS = Limits(max_values=10**7, max_candidates=10**4, max_history=10**6)

Infer = Callable[[RequestTensors], np.ndarray]  # sends one request, returns CACHED_TOKENS [B]


@dataclass
class Cell:
    """Measurements of one (batch, fraction) pair."""

    primed_tokens: int
    latencies_ms: list[float] = field(default_factory=list)
    cached_seen: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Server:
    """A running `hstu-replay server serve` subprocess and where it listens."""

    process: subprocess.Popen
    grpc_port: int
    log: Path


@dataclass(frozen=True)
class Settings:
    """What one run measures."""

    repository: Path
    engine: str  # a key of target.build.ENGINE_KINDS
    config: str
    dtype: str | None  # None: the config's
    device: str
    history: int  # items per user
    candidates: int
    cache_budget_tokens: int
    batches: list[int]
    repeats: int
    budget_s: float  # per (mode, batch): no new repetition starts after this
    threads: int  # torch/OpenMP threads of the model; 0: torch's default
    seed: int


# ----------------------------------------------------------------------------- requests


class KeySource:
    """Hands out cache keys never used before in this run."""

    def __init__(self, start: int) -> None:
        self._next = start

    def take(self, n: int) -> list[int]:
        keys = list(range(self._next, self._next + n))
        self._next += n
        return keys


def make_users(rng: np.random.Generator, keys: list[int], items: int, candidates: int) -> list[UserRequest]:
    """Synthetic users with `items` history items and `candidates` candidates, one per key."""
    return [
        UserRequest(
            user_id=int(rng.integers(1, 1_000_000)),
            context=tuple(int(x) for x in rng.integers(1, 16, size=5)),
            history_items=rng.integers(1, 10_000_000, size=items, dtype=np.int64),
            history_actions=rng.integers(0, 256, size=items, dtype=np.int64),
            candidates=rng.integers(1, 10_000_000, size=candidates, dtype=np.int64),
            cache_key=key,
        )
        for key in keys
    ]


def prefix(users: list[UserRequest], items: int) -> list[UserRequest]:
    """The same users (same keys) with only their first `items` history items."""
    return [
        UserRequest(u.user_id, u.context, u.history_items[:items], u.history_actions[:items], u.candidates, u.key)
        for u in users
    ]


def primed_tokens(fraction: float, history: int) -> int:
    """History tokens a fresh key holds after the prime for `fraction` (0: no prime)."""
    items = prime_items(fraction, history)
    return 0 if items is None else history_tokens(items)


# ----------------------------------------------------------------------------- measuring


def measure(infer: Infer, clear: Callable[[], None], settings: Settings) -> dict:
    """Time the full request at every fraction; returns {(batch, fraction): Cell}."""
    rng = np.random.default_rng(settings.seed)
    keys = KeySource(1 << 40)
    cells = {(b, f): Cell(primed_tokens(f, settings.history)) for b in settings.batches for f in FRACTIONS}
    for batch in settings.batches:
        for _ in range(WARMUP_REQUESTS):
            infer(build_request(make_users(rng, keys.take(batch), settings.history, settings.candidates), LIMITS))
        clear()
        deadline = time.monotonic() + settings.budget_s
        for _ in range(settings.repeats):
            if time.monotonic() > deadline:
                print(f"note: batch {batch}: --budget-s {settings.budget_s:g} spent; fewer repeats", file=sys.stderr)
                break
            for fraction in FRACTIONS:
                run_one(infer, rng, keys, batch, fraction, cells[(batch, fraction)], settings)
            clear()
    return cells


def run_one(infer: Infer, rng: np.random.Generator, keys: KeySource, batch: int, fraction: float, cell: Cell,
            settings: Settings) -> None:
    """Prime fresh keys to `fraction` (untimed), then time the full request with the same keys."""
    users = make_users(rng, keys.take(batch), settings.history, settings.candidates)
    items = prime_items(fraction, settings.history)
    if items is not None:
        infer(build_request(prefix(users, items), LIMITS))
    tensors = build_request(users, LIMITS)
    started = time.perf_counter()
    cached = infer(tensors)
    cell.latencies_ms.append((time.perf_counter() - started) * 1e3)
    cell.cached_seen.update(int(c) for c in cached)


def in_process_mode(settings: Settings) -> dict:
    """Measure the serving engine's `infer` in this interpreter."""
    import torch

    from hstu_replay.server.build import ENGINE_KINDS

    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    engine = ENGINE_KINDS[settings.engine](settings.repository, model_config(settings), settings.seed,
                                           settings.cache_budget_tokens, 32, settings.device).cached
    return measure(lambda t: engine.infer(t).cached_tokens, engine.clear_cache, settings)


def triton_mode(settings: Settings) -> dict:
    """Measure through a real tritonserver, always stopping it afterwards."""
    import tritonclient.grpc as grpc

    server = start_server(settings)
    client = None
    try:
        client = grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        return measure(lambda t: triton_infer(client, t), lambda: triton_clear(client), settings)
    finally:
        if client is not None:
            client.close()
        code = stop_server(server)
        if code == 0:
            server.log.unlink(missing_ok=True)
        else:
            print(f"warning: the server exited {code}; its log: {server.log}", file=sys.stderr)


def triton_infer(client, tensors: RequestTensors) -> np.ndarray:
    """One blocking gRPC request to the KV-cache model; returns its CACHED_TOKENS."""
    import tritonclient.grpc as grpc

    inputs = []
    for name, array in tensors.inputs(KVCACHE).items():
        item = grpc.InferInput(name, list(array.shape), "INT64")
        item.set_data_from_numpy(array)
        inputs.append(item)
    outputs = [grpc.InferRequestedOutput(n) for n in (KVCACHE.logits_output, "CACHED_TOKENS")]
    result = client.infer(KVCACHE.model_name, inputs, outputs=outputs, client_timeout=60.0)
    return result.as_numpy("CACHED_TOKENS")


def triton_clear(client) -> None:
    """Empty the server's KV cache through the control model."""
    import tritonclient.grpc as grpc

    item = grpc.InferInput("CLEAR", [1], "INT64")
    item.set_data_from_numpy(np.array([1], dtype=np.int64))
    client.infer("hstu_kvcache_control", [item], client_timeout=60.0)


# ----------------------------------------------------------------------------- the server


def start_server(settings: Settings, extra: list[str] | None = None) -> Server:
    """Start `hstu-replay server serve` (with `extra` arguments) on free ports; wait (bounded)
    until it says it serves."""
    threads = settings.threads
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads > 0 else {}))
    http, grpc, metrics, cache_metrics = free_ports(4)
    log = Path(tempfile.mkstemp(prefix="target-latency-bench-", suffix=".log")[1])
    command = [sys.executable, "-m", "hstu_replay.cli", "server", "serve", "--repository", str(settings.repository),
               "--config", settings.config, "--engine", settings.engine, "--device", settings.device,
               "--cache-budget-tokens", str(settings.cache_budget_tokens),
               "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
               "--metrics-port", str(metrics), "--cache-metrics-port", str(cache_metrics)]
    command += ["--dtype", settings.dtype] if settings.dtype else []
    command += extra or []
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                   start_new_session=True)
    server = Server(process, grpc, log)
    try:
        if wait_ready(server):
            return server
    except BaseException:  # Ctrl-C while waiting: do not leave the server behind
        stop_server(server)
        raise
    stop_server(server)
    raise RuntimeError(f"the server did not become ready; log {log}:\n{log.read_text(errors='replace')[-3000:]}")


def wait_ready(server: Server) -> bool:
    """Poll the log (bounded by READY_TIMEOUT_S) until the server says it serves."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline and server.process.poll() is None:
        if "hstu-replay: serving" in server.log.read_text(errors="replace"):
            return True
        time.sleep(0.25)
    return False


def stop_server(server: Server) -> int | None:
    """SIGTERM, then SIGKILL to the server's own process group if it does not exit in time.

    Returns the exit code (None if it could not be reaped); 0 only for a clean shutdown.
    """
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"warning: server pid {server.process.pid} ignored SIGTERM; killing it", file=sys.stderr)
    try:  # whatever is left of its own session (tritonserver, backend stubs)
        os.killpg(server.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return server.process.wait(10)
    except subprocess.TimeoutExpired:
        print(f"warning: server pid {server.process.pid} did not exit after SIGKILL", file=sys.stderr)
        return None


# ----------------------------------------------------------------------------- reporting


def table(title: str, cells: dict, batches: list[int], history: int) -> str:
    """A markdown table of one mode's cells, with the p50 speed-up over the 0% cell."""
    full = history_tokens(history)
    lines = [f"### {title}", "",
             "| batch | cached (target) | cached (primed) | n | mean ms | p50 ms | p90 ms | p50 ms / user | p50 speed-up |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for batch in batches:
        base = float(np.percentile(cells[(batch, 0.0)].latencies_ms, 50))
        for fraction in FRACTIONS:
            cell = cells[(batch, fraction)]
            ms = np.array(cell.latencies_ms)
            p50, p90 = np.percentile(ms, [50, 90])
            lines.append(f"| {batch} | {fraction:.0%} | {cell.primed_tokens / full:.1%} ({cell.primed_tokens} tok) "
                         f"| {len(ms)} | {ms.mean():.2f} | {p50:.2f} | {p90:.2f} | {p50 / batch:.3f} | {base / p50:.2f}x |")
    return "\n".join(lines)


def cached_check(title: str, cells: dict) -> tuple[str, bool]:
    """One line per cell: the primed tokens against the CACHED_TOKENS the engine reported."""
    lines, ok = [f"CACHED_TOKENS check ({title}):"], True
    for (batch, fraction), cell in cells.items():
        good = cell.cached_seen == {cell.primed_tokens}
        ok &= good
        lines.append(f"  batch {batch} {fraction:>4.0%}: primed {cell.primed_tokens:>3}, reported "
                     f"{sorted(cell.cached_seen)} {'ok' if good else 'MISMATCH'}")
    return "\n".join(lines), ok


def uptime() -> str:
    """`uptime`'s line, or the load averages if the command is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "runs" / "model_repository",
                        help="compiled repository (compiled for the small config if missing)")
    parser.add_argument("--repeats", type=int, default=30, help="measured requests per (batch, fraction)")
    parser.add_argument("--batches", default="1,8", help="batch sizes, comma-separated (1..8)")
    parser.add_argument("--modes", default="in-process,triton", help="in-process, triton or both")
    parser.add_argument("--budget-s", type=float, default=60.0,
                        help="seconds per (mode, batch) after which no new repetition starts")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch/OpenMP threads of the model, in both modes (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="aoti", choices=("aoti", "batched"), help="server serve --engine")
    parser.add_argument("--config", default="small", help="model config")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"), help="--engine batched only")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--history", type=int, default=256, help="history items per user")
    parser.add_argument("--candidates", type=int, default=32, help="candidates per user")
    parser.add_argument("--cache-budget-tokens", type=int, default=3_276_800)
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.batches or not all(1 <= b <= 8 for b in args.batches) or args.repeats < 1 or args.budget_s <= 0:
        parser.error("--batches must be in 1..8, --repeats at least 1 and --budget-s positive")
    if not set(args.modes) <= {"in-process", "triton"}:
        parser.error("--modes takes in-process and/or triton")
    return args


def model_config(settings: Settings):
    from hstu_replay.server.config import get_config

    return get_config(settings.config, settings.dtype)


def load1() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    settings = Settings(args.repository, args.engine, args.config, args.dtype, args.device, args.history,
                        args.candidates, args.cache_budget_tokens, args.batches, args.repeats, args.budget_s,
                        args.threads, args.seed)
    config = model_config(settings)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPUs"
    print(f"engine {args.engine}, config {config.name} ({config.num_layers} layers, {config.dtype}) on {device}, "
          f"history {args.history} items ({history_tokens(args.history)} tokens), {args.candidates} candidates, "
          f"{args.repeats} repeats, batches {args.batches}, torch threads {args.threads or torch.get_num_threads()}")
    print(f"uptime at start: {uptime()}", flush=True)
    modes = {"in-process": in_process_mode, "triton": triton_mode}
    all_ok = True
    for name in args.modes:
        started, load_before = time.perf_counter(), load1()
        cells = modes[name](settings)
        print()
        print(table(f"{name} ({time.perf_counter() - started:.0f} s, 1-min load {load_before:.2f} -> {load1():.2f})",
                    cells, args.batches, args.history))
        print()
        check, ok = cached_check(name, cells)
        all_ok &= ok
        print(check, flush=True)
    print()
    print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"torch {torch.__version__}")
    print(f"uptime at end: {uptime()}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
