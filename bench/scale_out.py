"""Scale-out: one master and N Locust workers against a server that is not the limit.

    python -m bench.scale_out                       # N = 1, 2; about 3 minutes
    python -m bench.scale_out --workers 1,2,4,8 --seconds 10   # on a host with the cores for it

A do-nothing PyTriton model with the KV-cache interface and `--instances` model instances runs in
a child process. For each N: a headless master (`locust -f locustfiles/hstu.py --master`) and N
workers on loopback replay the same dumps (8 x (2,048 + 16) values, hit ratio 0, verification off),
`--users-per-worker` users each, closed loop. Over one steady window: requests counted by the
server, CPU of the master and of every worker from /proc. The run then ends by itself, and the
report's merged percentiles are checked against the records every worker wrote (the histogram
of the concatenated records must equal the merged one, and so its percentiles). Beside each N,
the workers the capacity planner (`capacity.workers`) asks for at that rate, from the one-worker
run's CPU per request, and the workers the run's own CPU needed.
Prints a markdown table, the command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import harness
from bench.harness import ROOT, Shape
from hstu_replay.capacity.workers import DEFAULT_CORE_SHARE, workers_needed
from hstu_replay.interface import KVCACHE
from hstu_replay.loadtest.command import locust_command
from hstu_replay.loadtest.records import read_records
from hstu_replay.process import free_ports
from hstu_replay.stats.histogram import LatencyHistogram

OUT = ROOT / "runs" / "scale-out"
SHAPE = Shape(8, 2048, 16)
MODEL = KVCACHE.model_name


@dataclass
class ScaleResult:
    workers: int
    users: int
    rps: float
    worker_cores: float
    worker_ms: float  # worker CPU per request
    master_cores: float
    master_us: float  # master CPU per request
    percentiles_exact: bool
    requests_in_report: int


def run(server, n: int, args, dumps: Path) -> ScaleResult:
    report = OUT / f"report-{n}"
    if report.exists():
        for old in report.glob("*"):
            old.unlink()
    (port,) = free_ports(1)
    users = n * args.users_per_worker
    stage = args.warm + args.seconds + 15
    common = ["--report-dir", str(report), "--loglevel", "WARNING"]
    master_cmd = harness.replay_command(server.url_for(args.protocol), args.protocol, dumps, report, stage,
                                        "--master", "--expect-workers", str(n), "--expect-workers-max-wait", "60",
                                        "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                                        "--verify-fraction", "0", "--loglevel", "WARNING",
                                        users=users, batch=SHAPE.batch, max_values=SHAPE.values)
    worker_cmd = locust_command("--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *common)
    logs = [OUT / f"master-{n}.log", *(OUT / f"worker-{n}-{i}.log" for i in range(n))]
    processes = []
    for command, log in zip([master_cmd] + [worker_cmd] * n, logs):
        with log.open("w") as out:
            processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT))
    master, workers = processes[0], processes[1:]
    try:
        harness.wait_for_load(server, MODEL, master, logs[0], 120)
        time.sleep(args.warm)
        windows = harness.read_windows(server, MODEL, processes, args.seconds)
        if master.wait(stage + 120) != 0:
            raise SystemExit(f"master exited {master.returncode}; see {logs[0]}")
        for w in workers:
            w.wait(60)
    finally:
        for p in processes:
            harness.stop(p)
    master_w, worker_ws = windows[0], windows[1:]
    worker_cores = sum(w.cores for w in worker_ws)
    return ScaleResult(n, users, master_w.rps, worker_cores, 1e3 * worker_cores / master_w.rps,
                       master_w.cores, 1e6 * master_w.cores / master_w.rps, *merged_exact(report))


def planned(result: ScaleResult, single: ScaleResult) -> tuple[int, int]:
    """The capacity planner's worker count for this run's rate (from the one-worker run's CPU per
    request, as `hstu-replay capacity` plans from a measured step) and the count this run's own
    worker CPU calls for."""
    needed = max(1, math.ceil(result.worker_cores / DEFAULT_CORE_SHARE - 1e-9))
    return workers_needed(result.rps, single.worker_ms), needed


def merged_exact(report: Path) -> tuple[bool, int]:
    """Whether the report's measured stage equals the histogram of every worker's records."""
    data = json.loads((report / "report.json").read_text())
    (stage,) = data["bins"]
    records = [r for r in read_records(report) if r["kind"] == "measure" and r["ok"] and r["stage"] == stage["name"]]
    rebuilt = LatencyHistogram.of_ms(r["latency_ms"] for r in records)
    exact = len(records) == stage["requests"] and all(
        abs(rebuilt.percentile_ms(q) - stage[f"p{key}_ms"]) < 1e-9 for q, key in ((50, "50"), (90, "90"), (99, "99")))
    return exact, stage["requests"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="worker counts to run (default 1,2)")
    parser.add_argument("--users-per-worker", type=int, default=4)
    parser.add_argument("--instances", type=int, default=8, help="model instances of the do-nothing server")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--seconds", type=float, default=10.0, help="steady window (default 10)")
    parser.add_argument("--warm", type=float, default=3.0, help="seconds after the first request before it")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    dumps = OUT / "dumps"
    harness.shape_dumps(SHAPE, dumps)
    load_before = harness.machine_load()
    server = harness.start_null(KVCACHE, OUT / "server.log", instances=args.instances)
    try:
        results = [run(server, int(n), args, dumps) for n in args.workers.split(",")]
    finally:
        server.stop()
    one = results[0].rps / results[0].workers
    rows = [[r.workers, r.users, r.rps, f"{r.rps / (one * r.workers):.2f}", r.worker_cores, r.worker_ms,
             r.master_cores, r.master_us, r.requests_in_report, "yes" if r.percentiles_exact else "NO",
             *planned(r, results[0])] for r in results]
    print()
    print(harness.table(["workers", "users", "req/s (server)", "to N x one worker", "worker cores", "worker CPU ms/req",
                         "master cores", "master CPU us/req", "measured requests", "merged p50/p90/p99 exact",
                         "planner: workers for this req/s", "workers this run's CPU needs"], rows))
    print(f"\nplanner: `hstu-replay capacity`'s count, ceil(req/s x CPU ms/request / 1000 / {DEFAULT_CORE_SHARE}), "
          f"with the one-worker run's CPU per request; beside it the same count from this run's own worker cores "
          f"(what the run needed, each worker at {DEFAULT_CORE_SHARE} of a core); the run used N")
    print()
    print(f"shape {SHAPE.name}, {args.protocol}, do-nothing model with {args.instances} instances; "
          f"{harness.this_command()}")
    print(f"load average before: {load_before}; after: {harness.machine_load()}; cores: {_cores()}")
    return 0 if all(r.percentiles_exact for r in results) else 1


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
