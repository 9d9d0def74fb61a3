"""The load generator's own cost against perf_analyzer's, in one run: CPU per request, latency floor, rate per core.

    python -m bench.client_cost                         # everything, about 40 minutes
    python -m bench.client_cost --seconds 8 --rounds 1 --skip floor,rate,transport   # section 1 only
    python -m bench.client_cost --cases "sessions 0,dumps" --shapes 2048 --protocols grpc

A do-nothing PyTriton model with the KV-cache interface runs in a child process, so server
compute hides nothing. Both clients read the same requests: for dumps, NVIDIA-format dumps of the
shape (reference logits all zero, which is what the model answers); for sessions and timeline, a
prepared store (`--store`, default a synthetic one of 1,000 users made once). perf_analyzer 2.51
(from the tritonclient 2.51.0 wheel) replays each workload's requests as our planner makes them,
primes included in send order, as an `--input-data` trace (`plan.perf_analyzer`).

1. CPU per request, one request in flight, per shape, protocol and workload (`--cases`): dumps
   (verification off, and every response verified), sessions at hit ratios 0, 0.5 and 1.0 and the
   natural replay (timeline, visits of 10 minutes of log time per request); each beside
   perf_analyzer replaying the same requests, `--rounds` times in turn so that drift on this
   shared machine hits every client alike. Our side is the real `locust -f locustfiles/hstu.py`.
   Each reading is a steady window (harness.measure): CPU of the client process, requests
   counted by the server (priming requests count: the server computes them); the share of primes
   among them is read from our report and shown beside. Over gRPC our worker runs once per
   `--grpc-transports` (h2, grpcio) beside the same perf_analyzer reading.
2. Latency floor: batch 1 x (1 + 1) requests; perf_analyzer's p50 over its stable windows
   against our Locust report's p50 for the stage, same server, each protocol.
3. Requests per second of one worker core: `--users` users against the model with as many
   instances; requests counted by the server over the cores the worker kept busy.
4. The transports alone, each in a gevent-patched child process as in a Locust worker, one
   request in flight over the shape's requests: tritonclient (InferInput per call, what the
   first version sent with) against ours (`TritonClient.infer`, over gRPC through each transport),
   and for gRPC grpcio sending messages encoded before the loop (the floor of any gRPC client on
   grpcio); CPU from getrusage; beside each call's wall time, Triton's own mean per request
   (`success`, the child's warm-up requests included) and the difference: the client, the
   transport and Triton's frontend, what a model's speed cannot change. Needs no perf_analyzer
   (`--skip cpu,floor,rate`: this section alone, e.g. on a GPU machine).
Prints markdown tables, the commands and the machine's load. Exit 2 with one line if
perf_analyzer cannot be obtained or run (for the sections that use it).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import harness
from bench.gpu_triton_stats import per_request_ms, snapshot
from bench.harness import ROOT, Shape, Window
from hstu_replay.interface import KVCACHE

OUT = ROOT / "runs" / "client-cost"
SHAPES = {"4096": Shape(8, 4096, 100), "2048": Shape(8, 2048, 16)}
FLOOR = Shape(1, 1, 1)
MODEL = KVCACHE.model_name


@dataclass(frozen=True)
class Case:
    """One workload as both clients send it: our worker's arguments, and the same requests
    (primes included, in send order) as perf_analyzer's trace."""

    name: str
    workload: str  # plan.workloads name
    ratio: float = 0.0
    verify: bool = False  # our worker checks every response (dumps: against their references)

    @property
    def trace_name(self) -> str:  # verification changes our side only: one trace, one perf_analyzer reading
        return f"{self.workload}-{self.ratio:g}"


CASES = {c.name: c for c in (
    Case("dumps", "dumps"),
    Case("dumps verified", "dumps", verify=True),
    Case("sessions 0", "sessions", 0.0),
    Case("sessions 0.5", "sessions", 0.5),
    Case("sessions 1.0", "sessions", 1.0),
    Case("timeline", "timeline"),
)}
TRACE_REQUESTS = {"dumps": 0, "sessions": 300, "timeline": 2000}  # measured requests of a trace (dumps: all 16)
TIME_SLICE_MS = 600_000  # timeline: visits of ten minutes of log time share a request (up to the batch)


@dataclass
class Reading:
    shape: Shape
    protocol: str
    case: str
    client: str  # PERF_ANALYZER or OURS
    round: int
    window: Window
    primes: float | None = None  # our worker: priming requests per request the server counted
    transport: str = ""  # our worker over gRPC: --triton-grpc-transport


PERF_ANALYZER, OURS = "perf_analyzer 2.51", "Locust worker"


def data_arguments(case: Case, shape: Shape, dumps: Path, store: Path) -> list[str]:
    """The worker's --workload arguments for `case` at `shape`."""
    if case.workload == "dumps":
        return ["--workload", "dumps", "--dump-dir", str(dumps), "--hit-ratios", "0"]
    limits = ["--store", str(store), "--max-history", str(shape.history), "--candidates", str(shape.candidates)]
    if case.workload == "timeline":
        return ["--workload", "timeline", *limits, "--time-slice-ms", str(TIME_SLICE_MS)]
    return ["--workload", "sessions", *limits, "--hit-ratios", f"{case.ratio:g}"]


def case_trace(case: Case, shape: Shape, folder: Path, dump_requests: list, store: Path) -> Path:
    if case.workload == "dumps":
        return harness.perf_analyzer_trace(dump_requests, KVCACHE, folder / "trace.json")
    from hstu_replay.interface import Limits
    from hstu_replay.plan.workloads import WorkloadOptions

    options = WorkloadOptions(str(store), shape.candidates, Limits(max_history=shape.history, max_values=shape.values),
                              slice_ms=TIME_SLICE_MS if case.workload == "timeline" else 0)
    return harness.workload_trace(case.workload, options, case.ratio, shape.batch, TRACE_REQUESTS[case.workload],
                                  KVCACHE, folder / f"trace-{case.trace_name}.json")


def prime_share(report: Path) -> float | None:
    """Priming requests per request the server counted, from the worker's report (written at its stop)."""
    try:
        b = harness.report_bin(report)
        return b["prime_requests"] / b["server_requests"] if b["server_requests"] else None
    except (OSError, ValueError, KeyError, SystemExit):
        return None


def cpu_per_request(server, shape: Shape, protocol: str, args, pa_env, store: Path) -> list[Reading]:
    folder = OUT / f"{shape.history}x{shape.candidates}"
    dumps = folder / "dumps"
    dump_requests = harness.shape_dumps(shape, dumps)
    cases = [CASES[name] for name in args.cases]
    traces = {c.trace_name: case_trace(c, shape, folder, dump_requests, store) for c in cases}
    url = server.url_for(protocol)
    transports = args.grpc_transports if protocol == "grpc" else [""]
    readings = []
    for r in range(args.rounds):
        theirs: dict[str, Window] = {}
        for case in cases:
            if case.trace_name not in theirs:
                command = harness.perf_analyzer_command(url, protocol, MODEL, traces[case.trace_name])
                theirs[case.trace_name] = harness.measure(command, server, MODEL, OUT / "client.log", args.seconds,
                                                          env=pa_env)
                readings.append(Reading(shape, protocol, case.trace_name, PERF_ANALYZER, r, theirs[case.trace_name]))
            for transport in transports:  # over gRPC, each transport beside the same perf_analyzer reading
                report = OUT / "report"
                chosen = ("--triton-grpc-transport", transport) if transport else ()
                ours = harness.workload_command(url, protocol, data_arguments(case, shape, dumps, store), report,
                                                args.seconds + 20, "--verify-fraction", "1" if case.verify else "0",
                                                *chosen, max_values=shape.values)
                window = harness.measure(ours, server, MODEL, OUT / "client.log", args.seconds)
                readings.append(Reading(shape, protocol, case.name, OURS, r, window, prime_share(report), transport))
                pa = theirs[case.trace_name]
                print(f"  {shape.name} {protocol:4s} {transport:6s} round {r + 1}: {case.name:18s} ours "
                      f"{window.cpu_ms:.3f} ms/request ({window.rps:,.0f} req/s), perf_analyzer {pa.cpu_ms:.3f} "
                      f"({pa.rps:,.0f} req/s): {window.cpu_ms / pa.cpu_ms:.2f}x (load {harness.machine_load()})",
                      flush=True)
    return readings


def cpu_table(readings: list[Reading]) -> str:
    """One row per case: our worker beside perf_analyzer on the same requests, the ratio per round."""
    rows = []
    ours: dict[tuple, list[Reading]] = {}
    for r in readings:
        if r.client == OURS:
            ours.setdefault((r.shape, r.protocol, r.transport, r.case), []).append(r)
    for (shape, protocol, transport, name), group in ours.items():
        trace = CASES[name].trace_name
        reference = {r.round: r.window for r in readings if (r.shape, r.protocol, r.case, r.client)
                     == (shape, protocol, trace, PERF_ANALYZER)}
        ratios = [r.window.cpu_ms / reference[r.round].cpu_ms for r in group]
        primes = [r.primes for r in group if r.primes is not None]
        rows.append([shape.name, protocol, transport or "-", name,
                     f"{statistics.median(primes):.2f}" if primes else "?",
                     statistics.median(reference[r.round].rps for r in group),
                     statistics.median(reference[r.round].cpu_ms for r in group),
                     statistics.median(r.window.rps for r in group),
                     statistics.median(r.window.cpu_ms for r in group),
                     statistics.median(r.window.system_ms for r in group),
                     statistics.median(r.window.faults for r in group),
                     f"{statistics.median(ratios):.2f}x" + (f" ({', '.join(f'{x:.2f}' for x in ratios)})"
                                                             if len(ratios) > 1 else "")])
    return harness.table(["shape", "protocol", "gRPC transport", "workload", "primes/request", "perf_analyzer req/s",
                          "perf_analyzer CPU ms/request", "ours req/s", "ours CPU ms/request", "of which system",
                          "ours faults/request", "ours to perf_analyzer"], rows)


def perf_analyzer_p50_ms(output: str) -> float:
    found = re.findall(r"p50 latency: (\d+) usec", output)
    if not found:
        raise SystemExit("perf_analyzer printed no p50 latency")
    return int(found[-1]) / 1e3


def latency_floor(server, protocol: str, args, pa_env) -> list:
    folder = OUT / "floor"
    requests = harness.shape_dumps(FLOOR, folder / "dumps")
    trace = harness.perf_analyzer_trace(requests, KVCACHE, folder / "trace.json")
    url = server.url_for(protocol)
    command = harness.perf_analyzer_command(url, protocol, MODEL, trace, stable=True)
    done = subprocess.run(command, capture_output=True, text=True, env=pa_env, timeout=300)
    if done.returncode:
        raise harness.Unavailable(f"perf_analyzer exited {done.returncode}: {done.stderr.strip()[-200:]}")
    theirs = perf_analyzer_p50_ms(done.stdout)
    report = OUT / f"floor-report-{protocol}"
    ours_command = harness.replay_command(url, protocol, folder / "dumps", report, args.floor_seconds, batch=1)
    subprocess.run(ours_command + ["--verify-fraction", "0"], cwd=ROOT, capture_output=True, timeout=300)
    ours = harness.report_bin(report)["p50_ms"]
    slack_ms = max(0.05 * theirs, 0.050)
    return [protocol, theirs, ours, (ours - theirs) * 1e3, "yes" if abs(ours - theirs) <= slack_ms else "no"]


def rate_per_core(args, pa_env) -> list[list]:
    server = harness.start_null(KVCACHE, OUT / "server-rate.log", instances=args.users)
    rows = []
    try:
        shape = SHAPES["2048"]
        folder = OUT / f"{shape.history}x{shape.candidates}"
        harness.shape_dumps(shape, folder / "dumps")
        for protocol in args.protocols:
            command = harness.replay_command(server.url_for(protocol), protocol, folder / "dumps", OUT / "report-rate",
                                             args.seconds + 20, "--verify-fraction", "0", users=args.users,
                                             max_values=shape.values)
            w = harness.measure(command, server, MODEL, OUT / "client.log", args.seconds)
            rows.append([protocol, args.users, w.rps, w.cores, w.rps / w.cores, w.cpu_ms])
    finally:
        server.stop()
    return rows


TRANSPORT_LOOP = """
from gevent import monkey; monkey.patch_all()
from grpc.experimental import gevent as grpc_gevent; grpc_gevent.init_gevent()
import resource, sys, time
from bench.harness import Shape, shape_dumps
from pathlib import Path
from hstu_replay.client.heap import keep_freed_memory
from hstu_replay.interface import KVCACHE
keep_freed_memory()
protocol, url, which, seconds = {protocol!r}, {url!r}, {which!r}, {seconds!r}
requests = shape_dumps(Shape(*{shape!r}), Path({dumps!r}))
if which == "ours":
    from hstu_replay.client.triton import ClientOptions, TritonClient
    client = TritonClient(ClientOptions(url=url, protocol=protocol, **{options!r})); client.connect()
    send = lambda r: client.infer(r).logits
elif which == "grpcio":  # grpcio's own floor: each request's message encoded once, before the loop
    import grpc
    from hstu_replay.client.grpc_message import METHOD, encode_request
    call = grpc.insecure_channel(url).unary_unary(METHOD)
    encoded = {{id(r): encode_request(KVCACHE.model_name, r.input_parts(KVCACHE), ("OUTPUT__0",)) for r in requests}}
    send = lambda r: call(encoded[id(r)])
else:
    import importlib
    module = importlib.import_module("tritonclient." + protocol)
    client = module.InferenceServerClient(url)
    def send(r):
        inputs = []
        for name, array in r.inputs(KVCACHE).items():
            item = module.InferInput(name, list(array.shape), "INT64"); item.set_data_from_numpy(array)
            inputs.append(item)
        return client.infer(KVCACHE.model_name, inputs, outputs=[module.InferRequestedOutput("OUTPUT__0")]).as_numpy("OUTPUT__0")
for r in requests: send(r)
usage = resource.getrusage(resource.RUSAGE_SELF); t0, c0, f0 = time.monotonic(), usage.ru_utime + usage.ru_stime, usage.ru_minflt
n = 0
while time.monotonic() - t0 < seconds:
    send(requests[n % len(requests)]); n += 1
usage = resource.getrusage(resource.RUSAGE_SELF)
print(n, time.monotonic() - t0, usage.ru_utime + usage.ru_stime - c0, usage.ru_minflt - f0, flush=True)
import os; os._exit(0)  # a gRPC channel left to interpreter teardown can hang the exit
"""


def transport_loops(server, shape: Shape, args) -> list[list]:
    """Section 4: the transports alone, in child processes."""
    rows = []
    dumps = OUT / f"{shape.history}x{shape.candidates}" / "dumps"
    harness.shape_dumps(shape, dumps)
    for protocol in args.protocols:
        variants = [("tritonclient", f"tritonclient.{protocol}, InferInput per call", {})]
        if protocol == "http":
            variants.append(("ours", "ours (sendmsg of the pieces)", {}))
        else:
            variants += [("ours", "ours, h2 (HTTP/2 on the event loop's socket, sendmsg of the pieces)",
                          {"grpc_transport": "h2"}),
                         ("ours", "ours, grpcio (hand-encoded)", {"grpc_transport": "grpcio"}),
                         ("grpcio", "grpcio alone, messages encoded before the loop (its floor)", {})]
        for which, name, options in variants:
            code = TRANSPORT_LOOP.format(root=str(ROOT), protocol=protocol, url=server.url_for(protocol), which=which,
                                         options=options,
                                         seconds=args.seconds, shape=(shape.batch, shape.history, shape.candidates),
                                         dumps=str(dumps))
            before = snapshot(server.ports.http)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
            if done.returncode:
                raise SystemExit(f"transport loop failed: {done.stderr.strip()[-300:]}")
            success = per_request_ms(before, snapshot(server.ports.http))[MODEL]["success"]
            n, seconds, cpu, faults = done.stdout.split()
            wall = 1e3 * float(seconds) / int(n)
            rows.append([shape.name, protocol, name, int(n) / float(seconds), wall, success, wall - success,
                         1e3 * float(cpu) / int(n), int(faults) / int(n)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="steady window per reading (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="readings of each client, in turn (default 2)")
    parser.add_argument("--shapes", default="4096,2048", help="of: " + ", ".join(SHAPES))
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--grpc-transports", default="h2,grpcio", help="our worker's gRPC transports, each beside "
                        "the same perf_analyzer reading (default h2,grpcio)")
    parser.add_argument("--floor-seconds", type=float, default=10.0, help="our measured stage for the floor")
    parser.add_argument("--users", type=int, default=4, help="users (and model instances) for the rate per core")
    parser.add_argument("--skip", default="", help="sections to leave out: cpu,floor,rate,transport")
    parser.add_argument("--cases", default=",".join(CASES), help="workloads of section 1, of: " + ", ".join(CASES)
                        + " (default all)")
    parser.add_argument("--store", default="", help="prepared store for sessions and timeline (default: a synthetic "
                        "one, made once under runs/client-cost)")
    args = parser.parse_args()
    args.protocols = args.protocols.split(",")
    args.grpc_transports = [t for t in args.grpc_transports.split(",") if t]
    if not args.grpc_transports or set(args.grpc_transports) - {"h2", "grpcio"}:
        parser.error(f"--grpc-transports {','.join(args.grpc_transports)!r}: of h2, grpcio")
    try:
        args.cases = parse_cases(args.cases)
    except ValueError as exc:
        parser.error(str(exc))
    skip = set(filter(None, args.skip.split(",")))
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        pa_env = harness.perf_analyzer_env() if {"cpu", "floor", "rate"} - skip else None
    except harness.Unavailable as exc:
        print(f"perf_analyzer unavailable: {exc}", file=sys.stderr)
        return 2
    store = None if "cpu" in skip else Path(args.store) if args.store else harness.synthetic_store(OUT / "store")
    load_before = harness.machine_load()
    server = harness.start_null(KVCACHE, OUT / "server.log")
    readings, floors, loops = [], [], []
    try:
        if "transport" not in skip:
            for key in args.shapes.split(","):
                loops += transport_loops(server, SHAPES[key], args)
        if "cpu" not in skip:
            for key in args.shapes.split(","):
                for protocol in args.protocols:
                    readings += cpu_per_request(server, SHAPES[key], protocol, args, pa_env, store)
        if "floor" not in skip:
            floors = [latency_floor(server, protocol, args, pa_env) for protocol in args.protocols]
    except harness.Unavailable as exc:
        print(f"perf_analyzer unavailable: {exc}", file=sys.stderr)
        return 2
    finally:
        server.stop()
    rates = rate_per_core(args, pa_env) if "rate" not in skip else []
    print()
    if loops:
        print("The transports alone (one request in flight, gevent-patched process, getrusage):\n")
        print(harness.table(["shape", "protocol", "transport", "req/s", "ms/request", "Triton success ms",
                             "outside Triton ms", "CPU ms/request", "faults/request"], loops))
        print()
    if readings:
        print("CPU per request, each workload beside perf_analyzer replaying the same requests (primes included; "
              "median over rounds, ratio per round in brackets):\n")
        print(cpu_table(readings))
        print()
    if floors:
        print(f"Latency floor, {FLOOR.name} requests, one in flight (p50, ms):\n")
        print(harness.table(["protocol", "perf_analyzer", "ours", "ours - theirs (us)", "within 5% or 50 us"], floors))
        print()
    if rates:
        print(f"Requests per second of one worker core ({SHAPES['2048'].name}, {args.users} users, "
              f"{args.users} model instances):\n")
        print(harness.table(["protocol", "users", "req/s", "worker cores busy", "req/s per core", "CPU ms/request"], rates))
        print()
    print(f"command: {harness.this_command()}")
    if pa_env is not None:
        print(f"perf_analyzer: {' '.join(harness.perf_analyzer_command('URL', 'PROTOCOL', MODEL, Path('TRACE')))}")
    print(f"load average before: {load_before}; after: {harness.machine_load()}")
    return 0


def parse_cases(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown or not names:
        raise ValueError(f"--cases {text!r}: {', '.join(map(repr, unknown)) or 'none given'}; use of: {', '.join(CASES)}")
    return names


if __name__ == "__main__":
    sys.exit(main())
