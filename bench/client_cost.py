"""The load generator's own cost against perf_analyzer's, in one run: CPU per request, latency floor, rate per core.

    python -m bench.client_cost                         # everything, about 8 minutes
    python -m bench.client_cost --seconds 6 --rounds 1  # quicker, noisier

A do-nothing PyTriton model with the KV-cache interface runs in a child process, so server
compute hides nothing. Every client reads the same requests: NVIDIA-format dumps of the shape
(reference logits all zero, which is what the model answers) for ours, the same batches as a
perf_analyzer `--input-data` trace for perf_analyzer 2.51 (from the tritonclient 2.51.0 wheel).

1. CPU per request, one request in flight, per shape and protocol: perf_analyzer, then our
   Locust worker (the real `locust -f locustfiles/hstu.py`, dump replay at hit ratio 0,
   verification off), then the same with every response verified; `--rounds` times in turn so
   that drift on this shared machine hits every client alike. Each reading is a steady window
   (harness.measure): /proc CPU of the client process, requests counted by the server.
2. Latency floor: batch 1 x (1 + 1) requests; perf_analyzer's p50 over its stable windows
   against our Locust report's p50 for the stage, same server, each protocol.
3. Requests per second of one worker core: `--users` users against the model with as many
   instances; requests counted by the server over the cores the worker kept busy.
4. The transports alone, each in a gevent-patched child process as in a Locust worker, one
   request in flight over the shape's requests: tritonclient (InferInput per call, what the
   first version sent with) against ours (`TritonClient.infer`), and for gRPC grpcio sending
   messages encoded before the loop (the floor of any gRPC client on grpcio); CPU from getrusage.
Prints markdown tables, the commands and the machine's load. Exit 2 with one line if
perf_analyzer cannot be obtained or run.
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
from bench.harness import ROOT, Shape, Window
from hstu_replay.interface import KVCACHE

OUT = ROOT / "runs" / "client-cost"
SHAPES = {"4096": Shape(8, 4096, 100), "2048": Shape(8, 2048, 16)}
FLOOR = Shape(1, 1, 1)
MODEL = KVCACHE.model_name


@dataclass
class Reading:
    shape: Shape
    protocol: str
    client: str
    round: int
    window: Window


def clients(shape: Shape, protocol: str, url: str, dumps: Path, trace: Path, seconds: float) -> dict[str, list[str]]:
    """The three clients of section 1, by name."""
    ours = harness.replay_command(url, protocol, dumps, OUT / "report", seconds + 20, max_values=shape.values)
    return {
        "perf_analyzer 2.51": harness.perf_analyzer_command(url, protocol, MODEL, trace),
        "Locust worker, verify off": ours + ["--verify-fraction", "0"],
        "Locust worker, verify all": ours + ["--verify-fraction", "1"],
    }


def cpu_per_request(server, shape: Shape, protocol: str, args, pa_env) -> list[Reading]:
    folder = OUT / f"{shape.history}x{shape.candidates}"
    requests = harness.shape_dumps(shape, folder / "dumps")
    trace = harness.perf_analyzer_trace(requests, KVCACHE, folder / "trace.json")
    readings = []
    for r in range(args.rounds):
        for name, command in clients(shape, protocol, server.url_for(protocol), folder / "dumps", trace,
                                     args.seconds).items():
            env = pa_env if name.startswith("perf_analyzer") else None
            window = harness.measure(command, server, MODEL, OUT / "client.log", args.seconds, env=env)
            readings.append(Reading(shape, protocol, name, r, window))
            print(f"  {shape.name} {protocol:4s} round {r + 1}: {name:28s} {window.cpu_ms:.3f} ms/request, "
                  f"{window.rps:,.0f} req/s, {window.faults:.1f} faults/request (load {harness.machine_load()})",
                  flush=True)
    return readings


def cpu_table(readings: list[Reading]) -> str:
    rows = []
    groups: dict[tuple, list[Reading]] = {}
    for r in readings:
        groups.setdefault((r.shape, r.protocol, r.client), []).append(r)
    for (shape, protocol, client), group in groups.items():
        reference = {r.round: r.window.cpu_ms for r in readings
                     if (r.shape, r.protocol) == (shape, protocol) and r.client.startswith("perf_analyzer")}
        ratios = [r.window.cpu_ms / reference[r.round] for r in group]
        rows.append([shape.name, protocol, client, statistics.median(r.window.rps for r in group),
                     statistics.median(r.window.cpu_ms for r in group),
                     statistics.median(r.window.system_ms for r in group),
                     statistics.median(r.window.faults for r in group),
                     f"{statistics.median(ratios):.2f}x" + (f" ({', '.join(f'{x:.2f}' for x in ratios)})"
                                                             if len(ratios) > 1 else "")])
    return harness.table(["shape", "protocol", "client", "req/s", "CPU ms/request", "of which system",
                          "faults/request", "to perf_analyzer"], rows)


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
    from hstu_replay.client.grpc_infer import METHOD, encode_request
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
        variants = [("tritonclient", f"tritonclient.{protocol}, InferInput per call"),
                    ("ours", f"ours ({'sendmsg of the pieces' if protocol == 'http' else 'hand-encoded'})")]
        if protocol == "grpc":
            variants.append(("grpcio", "grpcio alone, messages encoded before the loop (its floor)"))
        for which, name in variants:
            code = TRANSPORT_LOOP.format(root=str(ROOT), protocol=protocol, url=server.url_for(protocol), which=which,
                                         options={},
                                         seconds=args.seconds, shape=(shape.batch, shape.history, shape.candidates),
                                         dumps=str(dumps))
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
            if done.returncode:
                raise SystemExit(f"transport loop failed: {done.stderr.strip()[-300:]}")
            n, seconds, cpu, faults = done.stdout.split()
            rows.append([shape.name, protocol, name, int(n) / float(seconds), 1e3 * float(cpu) / int(n),
                         int(faults) / int(n)])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="steady window per reading (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="readings of each client, in turn (default 2)")
    parser.add_argument("--shapes", default="4096,2048", help="of: " + ", ".join(SHAPES))
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--floor-seconds", type=float, default=10.0, help="our measured stage for the floor")
    parser.add_argument("--users", type=int, default=4, help="users (and model instances) for the rate per core")
    parser.add_argument("--skip", default="", help="sections to leave out: cpu,floor,rate,transport")
    args = parser.parse_args()
    args.protocols = args.protocols.split(",")
    skip = set(filter(None, args.skip.split(",")))
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        pa_env = harness.perf_analyzer_env()
    except harness.Unavailable as exc:
        print(f"perf_analyzer unavailable: {exc}", file=sys.stderr)
        return 2
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
                    readings += cpu_per_request(server, SHAPES[key], protocol, args, pa_env)
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
        print(harness.table(["shape", "protocol", "transport", "req/s", "CPU ms/request", "faults/request"], loops))
        print()
    if readings:
        print("CPU per request (median over rounds; ratio per round in brackets):\n")
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
    print(f"perf_analyzer: {' '.join(harness.perf_analyzer_command('URL', 'PROTOCOL', MODEL, Path('TRACE')))}")
    print(f"load average before: {load_before}; after: {harness.machine_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
