"""Sustained load: a long headless run against the reference target, the worker's memory and CPU
per request compared between its first and last stretch.

    python -m bench.sustained                                  # one hour (about 62 minutes)
    python -m bench.sustained --minutes 2 --window-minutes 0.5 # a quick look

The reference target (`server serve`, the small config, CPU, one model thread, a KV-cache budget)
runs in a child process. One headless Locust process replays the sessions workload of the sample
store at batch 8 and hit ratio 0.9, open loop at a fixed `--rate` (so each stretch of the hour
carries the same work). Every `--every` seconds: the Locust process's resident memory and CPU time
(`hstu_replay.inspection`) and the requests the server has answered (its own statistics). At the end, over the first
and the last `--window-minutes` of the measured stage: mean RSS and CPU per request; a verdict
each (within `--tolerance`). The run's report must hold as many measured requests as its records,
and the server must have answered every request the records name (measured, primes, warm-up).
Prints a table, the verdicts, the command and the machine's load; writes `sustained.json`.
Exit 1 when a verdict fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import harness
from bench.harness import ROOT
from hstu_replay.inspection import ProcTimes, load_average, rss_mib
from hstu_replay.interface import KVCACHE
from hstu_replay.loadtest.command import headless_command
from hstu_replay.loadtest.records import read_records
from hstu_replay.process import ServerProcess

OUT = ROOT / "runs" / "sustained"
BUDGET_TOKENS = 262_144  # the server's KV cache (small config: 1 KiB per token), and the client's model of it
RATIO, BATCH = 0.9, 8


@dataclass(frozen=True)
class Sample:
    """One reading: seconds since the stage's first sample, the worker's RSS and CPU, the server's count."""

    t_s: float
    rss_mib: float
    cpu_s: float
    requests: int
    load1: float = 0.0  # the machine's 1-minute load average


@dataclass(frozen=True)
class Stretch:
    """The samples of one stretch of the run, summed up."""

    start_s: float
    end_s: float
    rss_mib: float  # mean of its samples
    requests: int
    cpu_s: float
    load1: float  # mean of its samples

    @property
    def cpu_ms(self) -> float:
        """Worker CPU per request the server answered, ms."""
        return 1e3 * self.cpu_s / self.requests if self.requests else float("nan")

    @property
    def rps(self) -> float:
        span = self.end_s - self.start_s
        return self.requests / span if span > 0 else float("nan")


@dataclass(frozen=True)
class Verdict:
    first: Stretch
    last: Stretch
    tolerance: float

    @property
    def rss_change(self) -> float:
        return self.last.rss_mib / self.first.rss_mib - 1

    @property
    def cpu_change(self) -> float:
        return self.last.cpu_ms / self.first.cpu_ms - 1

    @property
    def rss_flat(self) -> bool:
        return abs(self.rss_change) <= self.tolerance

    @property
    def cpu_constant(self) -> bool:
        return abs(self.cpu_change) <= self.tolerance


def stretch(samples: Sequence[Sample]) -> Stretch:
    """Mean RSS over `samples`, CPU and requests between the first and the last of them."""
    if len(samples) < 2:
        raise ValueError(f"a stretch needs two samples or more, got {len(samples)}")
    a, b = samples[0], samples[-1]
    return Stretch(a.t_s, b.t_s, sum(s.rss_mib for s in samples) / len(samples), b.requests - a.requests,
                   b.cpu_s - a.cpu_s, sum(s.load1 for s in samples) / len(samples))


def judge(samples: Sequence[Sample], window_s: float, tolerance: float = 0.10) -> Verdict:
    """The first `window_s` of the samples against the last `window_s`: as many sampling intervals
    each as fit in `window_s` (samples come at a steady interval, a little late at times)."""
    span = samples[-1].t_s - samples[0].t_s
    intervals = round(window_s / (span / (len(samples) - 1))) if len(samples) > 1 else 0
    if intervals < 1 or 2 * intervals > len(samples) - 1:
        raise ValueError(f"{span:.0f} s of {len(samples)} samples cannot hold two windows of {window_s:.0f} s")
    return Verdict(stretch(samples[: intervals + 1]), stretch(samples[-intervals - 1 :]), tolerance)


@dataclass(frozen=True)
class Books:
    """What the report, the records and the server say was sent."""

    report_measured: int
    records_measured: int
    report_sent: int  # measured + primes + warm-up, all stages, in the report
    records_sent: int  # every successful record, any kind
    server_answered: int  # successes the server counted over the run

    @property
    def consistent(self) -> bool:
        return self.report_measured == self.records_measured and self.report_sent == self.records_sent \
            == self.server_answered


def books(report_dir: Path, server_answered: int) -> Books:
    report = json.loads((report_dir / "report.json").read_text())
    records = [r for r in read_records(report_dir) if r["ok"]]
    report_measured = sum(b["requests"] for b in report["bins"])
    report_sent = report_measured + sum(b["prime_requests"] for b in report["bins"]) + report["warmup_requests"]
    return Books(report_measured, sum(r["kind"] == "measure" for r in records), report_sent, len(records),
                 server_answered)


def sample(server: ServerProcess, pid: int, t0: float) -> Sample:
    times = ProcTimes.of(pid)
    return Sample(time.monotonic() - t0, rss_mib(pid), times.user_s + times.system_s,
                  harness.successes(server, KVCACHE.model_name), load_average()[0])


def run(server: ServerProcess, args, store: Path) -> tuple[list[Sample], int, Path]:
    """The Locust run, sampled; returns the samples, what the server answered over it, the report."""
    report = OUT / "report"
    for old in report.glob("*") if report.exists() else ():
        old.unlink()
    seconds = args.minutes * 60
    command = headless_command(report, "-u", str(args.users), "-r", str(args.users), "-t", f"{int(seconds) + 120}s",
                               "--triton-url", server.grpc_url, "--workload", "sessions", "--store", str(store),
                               "--hit-ratios", str(RATIO), "--batch-sizes", str(BATCH), "--max-history", "256",
                               "--candidates", "16", "--arrival", "constant", "--request-rate", str(args.rate),
                               "--stage-seconds", str(seconds), "--warmup-seconds", str(args.warmup),
                               "--cache-budget-tokens", str(BUDGET_TOKENS))
    log = OUT / "locust.log"
    before = harness.successes(server, KVCACHE.model_name)
    locust = harness.client(command, log)
    samples = []
    try:
        harness.wait_for_load(server, KVCACHE.model_name, locust, 180)
        time.sleep(args.warmup)
        t0 = time.monotonic()
        for _ in range(int((seconds - 5) // args.every) + 1):  # all inside the stage
            if not locust.running:
                break
            samples.append(sample(server, locust.pid, t0))
            print(f"  {samples[-1].t_s:7.0f} s  RSS {samples[-1].rss_mib:7.1f} MiB  CPU {samples[-1].cpu_s:8.2f} s  "
                  f"server {samples[-1].requests:,}", flush=True)
            time.sleep(max(0.0, t0 + len(samples) * args.every - time.monotonic()))
        if not locust.wait(seconds + 300):
            raise SystemExit(f"sustained: Locust still running {seconds + 300:g} s after its stage began; see {log}")
        if locust.process.returncode != 0:
            raise SystemExit(f"sustained: Locust exited {locust.process.returncode}; see {log}")
    finally:
        locust.stop()
    return samples, harness.successes(server, KVCACHE.model_name) - before, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="measured minutes (default 60)")
    parser.add_argument("--window-minutes", type=float, default=10.0, help="first and last stretch compared (10)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples (default 30)")
    parser.add_argument("--rate", type=float, default=5.0, help="measured requests per second, open loop (5)")
    parser.add_argument("--users", type=int, default=2, help="users, the most requests in flight (2)")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of the stage left out (30)")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    if not (0 < 2 * args.window_minutes <= args.minutes and 0 < args.every <= 20 * args.window_minutes
            and args.rate > 0 and args.users >= 1 and args.warmup >= 0 and args.tolerance > 0):
        print("sustained: --minutes of two --window-minutes or more, --every above 0 and a third of a window at most, "
              "--rate and --tolerance above 0, --users of 1 or more, --warmup of 0 or more", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    store = OUT / "store"
    if not (store / "meta.json").exists():
        from hstu_replay.data.prepare import prepare

        prepare(ROOT / "datasets" / "sample", store)
    from hstu_replay.server.build import export_repository

    export_repository(OUT / "repository", "small", seed=0, device="cpu")
    load_before = harness.machine_load()
    server = ServerProcess.serve(OUT / "repository", OUT / "server.log", None, "--device", "cpu", "--threads", "1",
                                 "--cache-budget-tokens", str(BUDGET_TOKENS), cwd=ROOT).launch()
    try:
        samples, answered, report = run(server, args, store)
    finally:
        server.stop()
    load_after = harness.machine_load()
    verdict = judge(samples, args.window_minutes * 60, args.tolerance)
    counted = books(report, answered)
    print(harness.table(["stretch", "from s", "to s", "RSS MiB (mean)", "requests (server)", "req/s", "CPU s",
                         "CPU ms/request", "load average (1 min, mean)"],
                        [[name, s.start_s, s.end_s, s.rss_mib, s.requests, s.rps, s.cpu_s, s.cpu_ms, s.load1]
                         for name, s in (("first", verdict.first), ("last", verdict.last))]))
    print(f"\nworker RSS last/first {verdict.rss_change:+.1%}: {'flat' if verdict.rss_flat else 'NOT flat'} "
          f"(within {args.tolerance:.0%}); RSS min/max over the run {min(s.rss_mib for s in samples):.1f} / "
          f"{max(s.rss_mib for s in samples):.1f} MiB")
    print(f"worker CPU per request last/first {verdict.cpu_change:+.1%}: "
          f"{'constant' if verdict.cpu_constant else 'NOT constant'} (within {args.tolerance:.0%})")
    print(f"measured requests: report {counted.report_measured:,}, records {counted.records_measured:,}; all sent: "
          f"report {counted.report_sent:,}, records {counted.records_sent:,}, server {counted.server_answered:,}: "
          f"{'consistent' if counted.consistent else 'NOT consistent'}")
    print(f"\n{harness.this_command()}\nload average before: {load_before}; after: {load_after}")
    (OUT / "sustained.json").write_text(json.dumps(
        {"command": harness.this_command(), "load_before": load_before, "load_after": load_after,
         "rate": args.rate, "users": args.users, "batch": BATCH, "hit_ratio": RATIO,
         "samples": [asdict(s) for s in samples], "first": asdict(verdict.first), "last": asdict(verdict.last),
         "rss_change": verdict.rss_change, "cpu_change": verdict.cpu_change, "rss_flat": verdict.rss_flat,
         "cpu_constant": verdict.cpu_constant, "books": asdict(counted), "consistent": counted.consistent},
        indent=1))
    return 0 if verdict.rss_flat and verdict.cpu_constant and counted.consistent else 1


if __name__ == "__main__":
    sys.exit(main())
