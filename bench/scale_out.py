"""Scale-out: one master and N Locust workers at a fixed open-loop rate each, against a server not the limit.

    python -m bench.scale_out                                        # N = 1, 2; about 2 minutes
    python -m bench.scale_out --workers 1,2,4,8 --instances 16      # on a host with the cores for it

A do-nothing model with the KV-cache interface runs on the bundled tritonserver directly
(`null_model.py --frontend python-backend`, `--instances` backend stubs; no PyTriton proxy).
First its ceiling: the largest N of workers replay closed loop, `--users-per-worker` users each,
as fast as they can (the server's count over one window; a lower bound where those workers or
the host's cores ran out first). Then for each N: a headless master (`locust -f
locustfiles/hstu.py --master`) and N workers on loopback replay the same dumps (8 x (2,048 + 16)
values, hit ratio 0, verification off), open loop at `--rate-per-worker` requests/s each. Over one
steady window: requests counted by the server, CPU of the master and of every worker, the host's
busy cores (`hstu_replay.inspection`). The run then ends by itself, and the report's merged
percentiles are checked against the records every worker wrote (the histogram of the
concatenated records must equal the merged one, and so its percentiles).

A row is INVALID, not a measure of the workers, when something else can be the limit: the rate
offered is above `--server-share` of the server's ceiling, the host's busy cores are above
`--host-share` of its cores, or a worker's CPU is above `--worker-share` of a core (saturated).
Otherwise scale-out is met when the server answered 0.9 x N x what one worker sent or more, and
0.9 of the rate offered.
Beside each N, the workers the capacity planner (`capacity.worker_count`) asks for at that rate, from
the one-worker run's CPU per request, and the workers the run's own CPU needed.
Prints a markdown table, the verdicts, the command and the machine's load. Exit 1 when a row is
INVALID or missed, or its merged percentiles are not exact.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import harness
from bench.harness import ROOT, Shape
from hstu_replay.capacity.worker_count import DEFAULT_CORE_SHARE, workers_needed
from hstu_replay.inspection import HostTimes
from hstu_replay.interface import KVCACHE
from hstu_replay.loadtest.command import locust_command
from hstu_replay.loadtest.records import read_records
from hstu_replay.process import free_ports
from hstu_replay.stats.histogram import LatencyHistogram

OUT = ROOT / "runs" / "scale-out"
SHAPE = Shape(8, 2048, 16)
MODEL = KVCACHE.model_name
SCALE_OUT_SHARE = 0.9  # N workers must carry this share of N x one worker


@dataclass(frozen=True)
class Thresholds:
    """When a run measures something other than the workers."""

    server_share: float = 0.8  # of the server's ceiling, offered
    host_share: float = 0.9  # of the host's cores, busy
    worker_share: float = 0.9  # of one core, one worker


@dataclass(frozen=True)
class ScaleResult:
    workers: int
    users: int
    offered_rps: float  # 0: closed loop
    rps: float  # answered by the server
    worker_cores: float  # all workers together
    worker_peak: float  # the busiest worker's cores
    worker_ms: float  # worker CPU per request
    master_cores: float
    master_us: float  # master CPU per request
    host_cores: float  # the host's busy cores (every process)
    percentiles_exact: bool
    requests_in_report: int


def limits(result: ScaleResult, ceiling_rps: float, host_cores: int, t: Thresholds) -> list[str]:
    """What else than the workers may have limited this run (empty: nothing)."""
    found = []
    if result.offered_rps > t.server_share * ceiling_rps:
        found.append(f"server (offered {result.offered_rps:,.0f} req/s > {t.server_share:.0%} of its ceiling "
                     f"{ceiling_rps:,.0f})")
    if result.host_cores > t.host_share * host_cores:
        found.append(f"host cores ({result.host_cores:.2f} of {host_cores} busy)")
    if result.worker_peak > t.worker_share:
        found.append(f"worker CPU ({result.worker_peak:.2f} of a core)")
    return found


def verdict(result: ScaleResult, single: ScaleResult, found: Sequence[str]) -> str:
    """INVALID (what limited it), met or MISSED: N workers against 0.9 x N x one worker, and the
    rate offered (a worker that cannot keep its schedule misses, its users too few for the latency)."""
    if found:
        return "INVALID: " + "; ".join(found)
    if result.rps < SCALE_OUT_SHARE * result.offered_rps:
        return f"MISSED (answered {result.rps / result.offered_rps:.2f} of the rate offered)"
    ratio = scaling(result, single)
    return f"{'met' if ratio >= SCALE_OUT_SHARE else 'MISSED'} ({ratio:.2f} of N x one worker)"


def scaling(result: ScaleResult, single: ScaleResult) -> float:
    """What N workers carried over N x what one worker did."""
    return result.rps / (result.workers * single.rps / single.workers)


def planned(result: ScaleResult, single: ScaleResult) -> tuple[int, int]:
    """The capacity planner's worker count for this run's rate (from the one-worker run's CPU per
    request, as `hstu-replay capacity` plans from a measured step) and the count this run's own
    worker CPU calls for."""
    needed = max(1, math.ceil(result.worker_cores / DEFAULT_CORE_SHARE - 1e-9))
    return workers_needed(result.rps, single.worker_ms), needed


def run(server, n: int, args, dumps: Path, rate_per_worker: float) -> ScaleResult:
    """One master and `n` workers; open loop at `rate_per_worker` each, closed loop at 0."""
    report = OUT / f"report-{n}" if rate_per_worker else OUT / "report-ceiling"
    if report.exists():
        for old in report.glob("*"):
            old.unlink()
    (port,) = free_ports(1)
    users = n * args.users_per_worker
    stage = args.warm + args.seconds + 15
    pace = ("--arrival", "constant", "--request-rate", str(n * rate_per_worker)) if rate_per_worker else ()
    common = ["--report-dir", str(report), "--loglevel", "WARNING"]
    master_cmd = harness.replay_command(server.url_for(args.protocol), args.protocol, dumps, report, stage,
                                        "--master", "--expect-workers", str(n), "--expect-workers-max-wait", "60",
                                        "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                                        "--verify-fraction", "0", "--loglevel", "WARNING", *pace,
                                        users=users, batch=SHAPE.batch, max_values=SHAPE.values)
    worker_cmd = locust_command("--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *common)
    name = n if rate_per_worker else "ceiling"
    logs = [OUT / f"master-{name}.log", *(OUT / f"worker-{name}-{i}.log" for i in range(n))]
    processes = []
    try:
        for command, log in zip([master_cmd] + [worker_cmd] * n, logs):
            processes.append(harness.client(command, log))
        master, workers = processes[0], processes[1:]
        harness.wait_for_load(server, MODEL, master, 120)
        time.sleep(args.warm)
        host_before = HostTimes.now()
        windows = harness.read_windows(server, MODEL, processes, args.seconds)
        host_after = HostTimes.now()
        if not master.wait(stage + 120):
            raise SystemExit(f"master still running {stage + 120:g} s after its stage began; see {logs[0]}")
        if master.process.returncode != 0:
            raise SystemExit(f"master exited {master.process.returncode}; see {logs[0]}")
        for w in workers:
            w.wait(60)
    finally:
        for p in processes:
            p.stop()
    master_w, worker_ws = windows[0], windows[1:]
    worker_cores = sum(w.cores for w in worker_ws)
    host_cores = (host_after.busy_s - host_before.busy_s) / master_w.seconds
    return ScaleResult(n, users, n * rate_per_worker, master_w.rps, worker_cores, max(w.cores for w in worker_ws),
                       1e3 * worker_cores / master_w.rps, master_w.cores, 1e6 * master_w.cores / master_w.rps,
                       host_cores, *merged_exact(report))


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
    parser.add_argument("--rate-per-worker", type=float, default=600.0, help="open-loop req/s of each worker (600)")
    parser.add_argument("--users-per-worker", type=int, default=4, help="users (requests in flight) per worker (4)")
    parser.add_argument("--ceiling-workers", type=int, default=0,
                        help="workers of the closed-loop ceiling probe (default: the largest of --workers)")
    parser.add_argument("--instances", type=int, default=8, help="backend stubs of the do-nothing model (8)")
    parser.add_argument("--frontend", default="python-backend", choices=("python-backend", "pytriton"),
                        help="the do-nothing server: the bundled tritonserver alone (default) or PyTriton")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--seconds", type=float, default=10.0, help="steady window (default 10)")
    parser.add_argument("--warm", type=float, default=3.0, help="seconds after the first request before it")
    defaults = Thresholds()
    for name, help_text in (("server-share", "offered, of the server's ceiling"),
                            ("host-share", "busy, of the host's cores"), ("worker-share", "one worker, of a core")):
        parser.add_argument(f"--{name}", type=float, default=getattr(defaults, name.replace("-", "_")),
                            help=f"a row above this share is INVALID: {help_text} (default %(default)s)")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or counts[0] != 1:
        print(f"scale_out: --workers {args.workers!r}: worker counts starting with 1, e.g. 1,2,4,8", file=sys.stderr)
        return 2
    if args.rate_per_worker <= 0 or args.users_per_worker < 1 or args.instances < 1 or args.ceiling_workers < 0:
        print("scale_out: --rate-per-worker above 0, --users-per-worker and --instances of 1 or more, "
              "--ceiling-workers of 0 or more", file=sys.stderr)
        return 2
    thresholds = Thresholds(args.server_share, args.host_share, args.worker_share)
    OUT.mkdir(parents=True, exist_ok=True)
    dumps = OUT / "dumps"
    harness.shape_dumps(SHAPE, dumps)
    load_before = harness.machine_load()
    server = harness.start_null(KVCACHE, OUT / "server.log", instances=args.instances,
                                extra=("--frontend", args.frontend))
    try:
        ceiling = run(server, args.ceiling_workers or max(counts), args, dumps, 0.0)
        results = [run(server, n, args, dumps, args.rate_per_worker) for n in counts]
    finally:
        server.stop()
    cores = os.cpu_count() or 1
    ceiling_limits = limits(ceiling, math.inf, cores, thresholds)
    single = results[0]
    rows, verdicts = [], []
    for r in results:
        verdicts.append(verdict(r, single, limits(r, ceiling.rps, cores, thresholds)))
        rows.append([r.workers, r.users, r.offered_rps, r.rps, f"{r.rps / r.offered_rps:.2f}",
                     f"{scaling(r, single):.2f}", r.worker_cores,
                     r.worker_peak, r.worker_ms, r.master_cores, r.master_us, r.host_cores, r.requests_in_report,
                     "yes" if r.percentiles_exact else "NO", *planned(r, single), verdicts[-1]])
    print()
    print(f"server ceiling: {ceiling.rps:,.0f} req/s from {ceiling.workers} workers x {args.users_per_worker} users "
          f"closed loop (workers {ceiling.worker_cores:.2f} cores, busiest {ceiling.worker_peak:.2f}; host "
          f"{ceiling.host_cores:.2f} of {cores} cores busy)"
          + (f"; a lower bound: {'; '.join(ceiling_limits)}" if ceiling_limits else ""))
    print(harness.table(["workers", "users", "offered req/s", "req/s (server)", "answered / offered",
                         "to N x one worker", "worker cores",
                         "busiest worker cores", "worker CPU ms/req", "master cores", "master CPU us/req",
                         "host busy cores", "measured requests", "merged p50/p90/p99 exact",
                         "planner: workers for this req/s", "workers this run's CPU needs", "verdict"], rows))
    print(f"\nplanner: `hstu-replay capacity`'s count, ceil(req/s x CPU ms/request / 1000 / {DEFAULT_CORE_SHARE}), "
          f"with the one-worker run's CPU per request; beside it the same count from this run's own worker cores "
          f"(what the run needed, each worker at {DEFAULT_CORE_SHARE} of a core); the run used N")
    print(f"INVALID: offered above {thresholds.server_share:.0%} of the server's ceiling, host above "
          f"{thresholds.host_share:.0%} of its cores busy, or a worker above {thresholds.worker_share:.0%} of a core; "
          f"met: the server answered {SCALE_OUT_SHARE} x N x one worker and of the rate offered or more")
    print()
    print(f"shape {SHAPE.name}, {args.protocol}, do-nothing model ({args.frontend}) with {args.instances} instances; "
          f"{harness.this_command()}")
    print(f"load average before: {load_before}; after: {harness.machine_load()}; cores: {cores}")
    ok = all(v.startswith("met") for v in verdicts) and all(r.percentiles_exact for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
