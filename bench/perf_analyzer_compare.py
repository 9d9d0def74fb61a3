"""perf_analyzer (C++) against our client: same target, same requests, one run; req/s and client CPU.

    python bench/perf_analyzer_compare.py                    # do-nothing server, full-length rows
    python bench/perf_analyzer_compare.py --server target    # `hstu-replay target serve`, small config

1. perf_analyzer 2.51 comes from the tritonclient==2.51.0 manylinux1 wheel (pip download, only
   `*/bin/perf_analyzer` unzipped) into runs/perf_analyzer/, with libb64/libcudart taken from the
   nvidia-pytriton wheel's bundled libraries (see /work/shared/reference/toolchain-notes.md).
2. The server runs in a child process: by default a do-nothing PyTriton model with the published
   `hstu_gr_ranking` interface (3 inputs), so server compute does not hide client cost; or the
   reference target. Statistics stay open (no access token needed).
3. The trace: `--requests` requests of B=8 users x 4096 history + 100 candidates
   (INPUT__0 = 67,184 int64) built with `build_request` (null server), or dump-replay requests
   (target); written with `hstu_replay.plan.perf_analyzer.write_trace` and read back for our client.
4. perf_analyzer, concurrency 1, its own stability windows; requests counted by the server's
   statistics, CPU from /proc every 0.5 s (steady state: from 1 s after the first request to the
   end) and getrusage(RUSAGE_CHILDREN) (whole process: start-up and JSON parsing included).
5. Our client: `TritonClient.infer` on the same requests, one in flight, as long as
   perf_analyzer's load lasted; CPU from getrusage(RUSAGE_SELF) (all threads). Then, for
   reference (at most 15 s each): plain tritonclient.grpc with its InferInputs built once, and
   raw gRPC sending each request's ModelInferRequest serialized once (the floor for Python).
Prints a markdown table, the commands and `uptime`. Exit 2 with one line if perf_analyzer cannot
be obtained or run.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import resource
import shlex
import subprocess
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hstu_replay.interface import NOCACHE, Limits  # noqa: E402
from hstu_replay.request import RequestTensors, UserRequest, build_request  # noqa: E402
from hstu_replay.target.serve import free_ports  # noqa: E402

from null_model import ChildServer, start_null  # noqa: E402

PA_DIR = ROOT / "runs" / "perf_analyzer"
PA_BIN = PA_DIR / "perf_analyzer"
PA_WHEEL = "tritonclient==2.51.0"
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Unavailable(Exception):
    """perf_analyzer cannot be obtained or run here (one line)."""


# -- perf_analyzer ------------------------------------------------------------------------------

def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _find_library(pattern: str) -> Path:
    sp = _site_packages()
    for folder in (sp / "pytriton", sp / "nvidia_pytriton.libs"):
        hits = sorted(glob.glob(str(folder / "**" / pattern), recursive=True))
        if hits:
            return Path(hits[0])
    raise Unavailable(f"no {pattern} under {sp}/pytriton or nvidia_pytriton.libs (install the target extra)")


def obtain_perf_analyzer() -> dict[str, str]:
    """Download and unpack perf_analyzer once; returns the environment it runs with."""
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


# -- servers ------------------------------------------------------------------------------------

def start_server(kind: str, repository: Path, log: Path, ready_s: float = 180.0) -> ChildServer:
    """The do-nothing `hstu_gr_ranking` or `hstu-replay target serve` in a child process, on free ports."""
    if kind == "null":
        return start_null(NOCACHE, log, ready_s)
    grpc, http, metrics, cache = free_ports(4)
    command = [str(Path(sys.executable).parent / "hstu-replay"), "target", "serve", "--repository",
               str(repository), "--device", "cpu", "--grpc-port", str(grpc), "--http-port", str(http),
               "--metrics-port", str(metrics), "--cache-metrics-port", str(cache)]
    return ChildServer.launch(command, grpc, log, "hstu-replay: serving", ready_s)


def server_count(client, model: str) -> int:
    """Successful inferences of `model` so far, from Triton's (open) statistics."""
    stats = client.get_inference_statistics(model, as_json=True)
    return sum(int(m["inference_stats"]["success"].get("count", 0)) for m in stats["model_stats"])


# -- traces -------------------------------------------------------------------------------------

def full_length_requests(count: int, seed: int) -> list[RequestTensors]:
    """B=8 users x (4096 history + 100 candidates), KuaiRand-like id ranges."""
    rng = np.random.default_rng(seed)
    limits = Limits(max_values=70_000)
    requests = []
    for r in range(count):
        users = [UserRequest(r * 8 + b, tuple(int(x) for x in rng.integers(1, 8, 5)),
                             rng.integers(1, 4_400_000, 4096), rng.integers(0, 256, 4096),
                             rng.integers(1, 4_400_000, 100)) for b in range(8)]
        requests.append(build_request(users, limits))
    return requests


def dump_requests(dump_dir: Path, count: int) -> list[RequestTensors]:
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.workloads import DumpWorkload, WorkloadOptions

    source = DumpWorkload(WorkloadOptions(str(dump_dir), 16, Limits(max_history=256))).source(KeyAllocator(0, 0))
    steps = [source.next_step(0.0, 8) for _ in range(count)]
    for step in steps:
        source.settle(step, True)
    return [step.request for step in steps]


# -- the two clients ----------------------------------------------------------------------------

@dataclass
class Result:
    tool: str
    requests: int
    seconds: float
    cpu_steady_s: float  # over the steady window
    steady_requests: int
    cpu_total_s: float  # whole process (perf_analyzer) or whole loop (ours)
    p50_ms: float
    rps: float

    @property
    def steady_ms(self) -> float:
        return 1e3 * self.cpu_steady_s / self.steady_requests if self.steady_requests else float("nan")

    @property
    def total_ms(self) -> float:
        return 1e3 * self.cpu_total_s / self.requests if self.requests else float("nan")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a whole process (all threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_perf_analyzer(command: list[str], env: dict[str, str], stats_client, model: str, timeout_s: float,
                      csv_path: Path) -> tuple[Result, float, str]:
    """Run it with /proc and server-count samples; returns the result, its load seconds, its output."""
    before_count = server_count(stats_client, model)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = csv_path.with_suffix(".log")
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    samples: list[tuple[float, float, int]] = []  # (time, cpu s, server count)
    deadline = time.monotonic() + timeout_s
    try:
        while process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                process.wait(10)
                raise SystemExit(f"perf_analyzer ran past {timeout_s:.0f} s; see {log}")
            try:
                samples.append((time.monotonic(), proc_cpu_s(process.pid),
                                server_count(stats_client, model) - before_count))
            except (OSError, IndexError):
                pass  # exited between poll() and the read
            time.sleep(0.5)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = log.read_text(errors="replace")
    stable = "Failed to obtain stable measurement" not in output
    if process.returncode != 0 and stable:
        raise Unavailable(f"perf_analyzer exited {process.returncode}: "
                          f"{(output.strip().splitlines() or ['no output'])[-1]}")
    total = server_count(stats_client, model) - before_count
    cpu_total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    loaded = [s for s in samples if s[2] > 0]
    if len(loaded) < 3:
        raise SystemExit(f"perf_analyzer sent too little to measure ({total} requests); see {log}")
    first = next((s for s in loaded if s[0] >= loaded[0][0] + 1.0), loaded[1])
    last = loaded[-1]
    seconds = last[0] - loaded[0][0]
    # Unstable windows (a busy machine) still sent real requests: their cost is measured all the same.
    p50 = _parse_p50(csv_path) if stable else float("nan")
    tool = "perf_analyzer 2.51 (C++)" + ("" if stable else ", no stable window")
    result = Result(tool, total, seconds, last[1] - first[1], last[2] - first[2], cpu_total, p50,
                    (last[2] - loaded[0][2]) / seconds)
    return result, seconds, output


def _parse_p50(path: Path) -> float:
    """perf_analyzer's p50 in ms (its last, stable window), from its -f CSV."""
    with path.open() as f:
        row = next(csv.DictReader(f))
    return float(row["p50 latency"]) / 1e3


def run_ours(url: str, model: str, requests: list[RequestTensors], seconds: float) -> Result:
    """`TritonClient.infer`, one request in flight, round-robin over the trace, for `seconds`."""
    from hstu_replay.client.triton import ClientOptions, TritonClient

    client = TritonClient(ClientOptions(url=url, model=model))
    try:
        client.connect()
        return timed_loop("hstu-replay TritonClient.infer (Python)", lambda i: client.infer(requests[i]),
                          len(requests), seconds)
    finally:
        client.close()


def timed_loop(tool: str, send, count: int, seconds: float) -> Result:
    """Call send(i) back to back for `seconds` (after 3 warm-up calls); CPU from getrusage."""
    for i in range(3):
        send(i % count)
    latencies = []
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    i = 0
    while time.perf_counter() < t0 + seconds:
        start = time.perf_counter()
        send(i % count)
        latencies.append(time.perf_counter() - start)
        i += 1
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return Result(tool, i, elapsed, cpu, i, cpu, float(np.median(latencies)) * 1e3, i / elapsed)


def run_prebuilt(url: str, model: str, requests: list[RequestTensors], seconds: float) -> Result:
    """Reference: plain tritonclient.grpc with every InferInput built once, before the clock starts."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    prepared = []
    for request in requests:
        inputs = []
        for name, array in request.inputs(NOCACHE).items():
            item = grpcclient.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(array)
            inputs.append(item)
        prepared.append(inputs)
    outputs = [grpcclient.InferRequestedOutput(NOCACHE.logits_output)]
    try:
        return timed_loop("reference: tritonclient.grpc, InferInputs prebuilt",
                          lambda i: client.infer(model, prepared[i], outputs=outputs).as_numpy("OUTPUT__0"),
                          len(prepared), seconds)
    finally:
        client.close()


def run_serialized(url: str, model: str, requests: list[RequestTensors], seconds: float) -> Result:
    """Reference: each ModelInferRequest serialized once; raw gRPC sends the bytes, parses the reply."""
    import grpc
    from tritonclient.grpc import service_pb2

    blobs = []
    for request in requests:
        message = service_pb2.ModelInferRequest(model_name=model)
        for name, array in request.inputs(NOCACHE).items():
            tensor = message.inputs.add(name=name, datatype="INT64")
            tensor.shape.extend(array.shape)
            message.raw_input_contents.append(array.tobytes())
        message.outputs.add(name=NOCACHE.logits_output)
        blobs.append(message.SerializeToString())
    channel = grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1),
                                                  ("grpc.max_receive_message_length", -1)])
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=None,
                               response_deserializer=service_pb2.ModelInferResponse.FromString)
    try:
        return timed_loop("reference: raw gRPC, request bytes serialized once",
                          lambda i: np.frombuffer(call(blobs[i]).raw_output_contents[0], dtype=np.float32),
                          len(blobs), seconds)
    finally:
        channel.close()


# -- the run ------------------------------------------------------------------------------------

def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def wait_for_quiet(max_load: float, max_wait_s: float, poll_s: float = 20.0) -> None:
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        print(f"waiting for 1-min load < {max_load}: {uptime()}", flush=True)
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.1)))
    print(f"load before measuring: {uptime()}", flush=True)


def table(results: list[Result]) -> str:
    base = results[0]
    lines = ["| tool | requests | seconds | req/s | p50 ms | CPU ms/req (steady) | CPU ms/req (whole run) "
             "| CPU ratio vs perf_analyzer |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r.tool} | {r.requests:,} | {r.seconds:.1f} | {r.rps:.0f} | {r.p50_ms:.2f} | "
                     f"{r.steady_ms:.3f} | {r.total_ms:.3f} | {r.steady_ms / base.steady_ms:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("null", "target"), default="null",
                        help="do-nothing hstu_gr_ranking (default) or the reference target")
    parser.add_argument("--requests", type=int, default=16, help="distinct requests in the trace (default 16)")
    parser.add_argument("--repository", default=str(ROOT / "runs" / "model_repository"))
    parser.add_argument("--dump-dir", default=str(ROOT / "runs" / "dumps-sample"), help="trace source, target mode")
    parser.add_argument("--measurement-interval", type=int, default=5000, help="perf_analyzer -p, ms")
    parser.add_argument("--max-trials", type=int, default=10, help="perf_analyzer -r (bounds its run)")
    parser.add_argument("--stability", type=float, default=10.0, help="perf_analyzer -s, percent (default 10)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="cap on our client's duration")
    parser.add_argument("--timeout", type=float, default=240.0, help="kill perf_analyzer after this many s")
    parser.add_argument("--max-load", type=float, default=1.2, help="wait for a 1-min load below this")
    parser.add_argument("--max-wait", type=float, default=600.0, help="longest wait for a quiet machine, s")
    args = parser.parse_args()
    try:
        env = obtain_perf_analyzer()
    except Unavailable as exc:
        print(f"perf_analyzer unavailable: {exc}", file=sys.stderr)
        return 2

    out = PA_DIR / "compare"
    out.mkdir(parents=True, exist_ok=True)
    model = NOCACHE.model_name
    if args.server == "target" and not (Path(args.repository) / model).is_dir():
        from hstu_replay.target.build import export_repository

        print(f"compiling the small target into {args.repository} (about a minute)", flush=True)
        export_repository(Path(args.repository), "small", 0, "cpu")
    requests = (full_length_requests(args.requests, seed=0) if args.server == "null"
                else dump_requests(Path(args.dump_dir), args.requests))
    from hstu_replay.plan.perf_analyzer import TraceEntry, read_trace, write_trace

    trace = out / f"trace-{args.server}.json"
    summary = write_trace((TraceEntry(r, False) for r in requests), NOCACHE, trace)
    replayed = read_trace(trace, NOCACHE)  # our client sends exactly what perf_analyzer reads
    print(f"trace: {trace} ({summary.entries} requests, {summary.bytes_written / 1e6:.1f} MB, "
          f"INPUT__0 of {len(replayed[0].values):,} int64)", flush=True)

    server = start_server(args.server, Path(args.repository), out / f"server-{args.server}.log")
    import tritonclient.grpc as grpcclient

    stats_client = grpcclient.InferenceServerClient(server.url)
    try:
        wait_for_quiet(args.max_load, args.max_wait)
        load_before = uptime()
        csv_path = out / f"perf_analyzer-{args.server}.csv"
        command = [str(PA_BIN), "-m", model, "-u", server.url, "-i", "grpc", "--input-data", str(trace),
                   "--concurrency-range", "1", "--measurement-interval", str(args.measurement_interval),
                   "-r", str(args.max_trials), "-s", str(args.stability), "-f", str(csv_path)]
        try:
            pa, seconds, pa_output = run_perf_analyzer(command, env, stats_client, model, args.timeout, csv_path)
        except Unavailable as exc:
            print(f"perf_analyzer unavailable: {exc}", file=sys.stderr)
            return 2
        before = server_count(stats_client, model)
        ours = run_ours(server.url, model, replayed, min(seconds, args.max_seconds))
        served = server_count(stats_client, model) - before
        short = min(seconds, args.max_seconds, 15.0)
        references = [run_prebuilt(server.url, model, replayed, short),
                      run_serialized(server.url, model, replayed, short)]
    finally:
        stats_client.close()
        server.stop()
    print()
    print(table([pa, ours, *references]))
    print()
    print(f"server: {args.server}; model {model}; trace {trace.name}: {summary.entries} requests round-robin; "
          f"our requests counted by the server: {served:,} (incl. 3 warm-up)")
    own = [line.strip() for line in pa_output.splitlines() if line.startswith("Concurrency:")]
    print("perf_analyzer's own figure (last window): " + (own[0] if own else "none: no stable window"))
    print("req/s: requests over the load's duration (perf_analyzer: as counted by the server). CPU steady: "
          "perf_analyzer from /proc, 1 s into its load to its end; ours from getrusage over the timed loop. "
          "Whole run: perf_analyzer's getrusage incl. start-up and parsing the trace")
    print(f"perf_analyzer command: LD_LIBRARY_PATH={PA_DIR / 'lib'} {shlex.join(command)}")
    print(f"this command: python {shlex.join(['bench/perf_analyzer_compare.py', *sys.argv[1:]])}")
    print(f"uptime before: {load_before}")
    print(f"uptime after:  {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
