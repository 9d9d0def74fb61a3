"""Scale of the load generator's per-request bookkeeping: the client's cache model, the accountant
with its records file, the workers' statistics merged at the master, and the final report.

    python -m bench.bookkeeping_scale                      # 10,000,000 requests (minutes)
    python -m bench.bookkeeping_scale --requests 1000000   # a shorter run
    python -m bench.bookkeeping_scale --quick              # 200,000 requests, seconds (what the test runs)

No server and no Locust users: the real `ActiveRun` objects of two workers and their master do
the bookkeeping of synthetic requests, as `loadtest.user` and `loadtest.hooks` drive them.
Request tensors are built once per shape and reused; each step gets fresh single-use user ids
(the dumps workload), primed first where its stage's hit ratio asks for cached tokens, and its
keys are retired after it, as a Locust user settles a step.

In the order printed:

- An accounting run: per sent request the cache model's prediction, `Accountant.file` (its
  `RunStats` bins and one JSON line through the real `RecordWriter`), then the step's keys
  retired. Steps alternate between the workers; every `--report-every` requests a worker's
  `RunStats.take()` travels as a Locust "stats" message (msgpack, both ways) to the master,
  which merges it as `loadtest.hooks` does. RSS (VmRSS) is sampled ten times over the run.
- The final report from the merged statistics through `loadtest.finish.write_final_report`
  (JSON, CSV, SVG charts, HTML), as the master writes it when Locust quits. Its req/s columns
  are the bench's own pace: no server answered.
- Where a request's bookkeeping goes: the cache model, the statistics, the record.
- The cache model alone (`CacheModel.predict` then `retire`): CPU per request and what it holds
  after 10k, 100k and 1M requests, without a budget (retired keys forgotten), under a budget
  (LRU eviction), and, for scale, without a budget and without retiring (every key kept).

Everything runs in one process, so its RSS covers both workers and the master.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hstu_replay.client.triton import ModelBinding
from hstu_replay.inspection import rss_mib
from hstu_replay.interface import KVCACHE
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.prepare import Placement, PreparedRun
from hstu_replay.loadtest.roles import LocalRole, MasterRole, WorkerRole
from hstu_replay.loadtest.runtime import ActiveRun, LoadTestRuntime
from hstu_replay.loadtest.schedule import Schedule
from hstu_replay.plan.cache_model import CacheModel
from hstu_replay.request import RequestTensors, UserRequest, build_request
from hstu_replay.stats.accounting import Outcome, Sent
from hstu_replay.stats.run_stats import BinKey, RunStats
from hstu_replay.verify import Verdict

BATCH = 8
CANDIDATES = 16
SHAPES = 16  # distinct request shapes per stage, each built once
FULL_REQUESTS = 10_000_000
QUICK_REQUESTS = 200_000
CACHE_CHECKPOINTS = (10_000, 100_000, 1_000_000)
QUICK_CACHE_CHECKPOINTS = (10_000, 50_000, 100_000)
KEPT_REFERENCE_REQUESTS = 100_000  # the every-key-kept reference stops here: it grows ~1 GiB per 1M
RSS_SAMPLES = 10
FLAT_MIB = 16.0  # RSS growth from the first sample to the last below which memory counts as flat
OK_VERDICT = Verdict(True, 0.0, -1)


# -- synthetic requests ---------------------------------------------------------------------

@dataclass(frozen=True)
class StepShape:
    """One reusable measured request and, where the stage asks for hits, its priming request."""

    request: RequestTensors
    prime: RequestTensors | None
    label: str


def history_lengths(rng: np.random.Generator, batch: int) -> np.ndarray:
    """History items per user: long-tailed like KuaiRand sessions, 32..2000 items (a batch of 8
    with 16 candidates each stays under the published 40,000 values)."""
    return np.clip(rng.lognormal(np.log(600), 0.8, batch), 32, 2000).astype(np.int64)


def tensors(items: np.ndarray, rng: np.random.Generator) -> RequestTensors:
    users = [UserRequest(b, (1, 2, 3, 4, 5), rng.integers(1, 10**7, n), rng.integers(0, 256, n),
                         rng.integers(1, 10**7, CANDIDATES)) for b, n in enumerate(items.tolist())]
    return build_request(users)


def step_shapes(goal_ratio: float, count: int, seed: int) -> list[StepShape]:
    rng = np.random.default_rng(seed)
    shapes = []
    for i in range(count):
        items = history_lengths(rng, BATCH)
        prime = None
        if goal_ratio > 0:  # the prime leaves the first goal_ratio of each history cached
            prime = tensors(np.maximum(np.rint(items * goal_ratio).astype(np.int64), 1), rng)
        label = "; ".join(f"batch_{i * BATCH + b:06d} user {b}" for b in range(BATCH))
        shapes.append(StepShape(tensors(items, rng), prime, label))
    return shapes


class FreshKeys:
    """Single-use cache keys, `BATCH` per step (its prime and its request), never sent again:
    the dumps workload's keys."""

    def __init__(self, start: int = 1 << 40):
        self.next_key = start

    def step(self, shape: StepShape) -> tuple[RequestTensors, RequestTensors | None]:
        ids = np.arange(self.next_key, self.next_key + BATCH, dtype=np.int64)
        self.next_key += BATCH
        prime = None if shape.prime is None else dataclasses.replace(shape.prime, user_ids=ids)
        return dataclasses.replace(shape.request, user_ids=ids), prime


# -- the cache model alone ------------------------------------------------------------------

@dataclass(frozen=True)
class CacheRow:
    variant: str
    requests: int
    us_per_request: float  # CPU since the previous checkpoint
    resident_keys: int
    resident_pages: int
    rss_growth_mib: float  # since the variant started


def cache_model_scale(variant: str, model: CacheModel, retire: bool, checkpoints: tuple[int, ...]) -> list[CacheRow]:
    shapes = step_shapes(0.0, SHAPES, seed=1)
    keys = FreshKeys()
    rows, done = [], 0
    rss0 = rss_mib()
    for checkpoint in checkpoints:
        cpu0 = time.process_time()
        for i in range(done, checkpoint):
            request, _ = keys.step(shapes[i % SHAPES])
            model.predict(request)
            if retire:
                model.retire(request.user_ids.tolist())
        cpu = time.process_time() - cpu0
        rows.append(CacheRow(variant, checkpoint, cpu / (checkpoint - done) * 1e6, len(model.ledger),
                             model.ledger.resident_pages, rss_mib() - rss0))
        done = checkpoint
    return rows


def cache_table(rows: list[CacheRow]) -> str:
    lines = ["| cache model | requests | CPU us/request | resident keys | resident pages | RSS growth MiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.variant} | {r.requests:,} | {r.us_per_request:.1f} | {r.resident_keys:,} | "
              f"{r.resident_pages:,} | {r.rss_growth_mib:.1f} |" for r in rows]
    return "\n".join(lines)


# -- the accounting run ---------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    requests: int  # sent so far, primes included
    elapsed_s: float
    cpu_s: float
    rss_mib: float
    records_mib: float
    master_buckets: int  # histogram buckets held by the master's merged statistics


@dataclass
class AccountingRun:
    requests: int
    workers: int
    samples: list[Sample]
    reports_sent: int
    report_bytes: int  # stats messages, all together
    merge_s: float  # master: unserialize + from_dict + merge, all together
    records_bytes: int

    @property
    def elapsed_s(self) -> float:
        return self.samples[-1].elapsed_s

    @property
    def rss_growth_mib(self) -> float:
        """RSS of the last sample over the first: what the run's length added."""
        return self.samples[-1].rss_mib - self.samples[0].rss_mib

    @property
    def flat(self) -> bool:
        return self.rss_growth_mib < FLAT_MIB


def config_for(report_dir: Path) -> LoadTestConfig:
    """Options of a dump replay sweep at batch 8 (the dump directory is never opened)."""
    import argparse

    return LoadTestConfig.from_options(argparse.Namespace(
        workload="dumps", dump_dir="(synthetic)", batch_sizes=str(BATCH), hit_ratios="0,0.5,0.9,1.0",
        arrival="poisson", request_rate=1000.0, report_dir=str(report_dir), max_p99_ms="250",
    ))


def prepared_run(config: LoadTestConfig, placement: Placement) -> PreparedRun:
    """What `loadtest.prepare` hands a process, for a KV-cache model that reports its hits; no
    workload: the steps are synthetic."""
    sweep = config.sweep
    schedule = Schedule(sweep.batches, sweep.ratios, sweep.warmup_seconds, sweep.stage_seconds)
    return PreparedRun(config, placement, ModelBinding(KVCACHE, reports_hits=True), schedule, None)


def latencies(rng: np.random.Generator, goal_ratio: float, chunk: int = 10_000) -> Iterator[tuple[float, float]]:
    """Endless (latency s, open-loop lag s): a long-tailed server, faster the more is cached.
    Drawn a chunk at a time, so the bench's own memory does not grow with the run."""
    median = 0.030 * (1.0 - 0.8 * goal_ratio)
    while True:
        latency = rng.lognormal(np.log(median), 0.5, chunk) + rng.pareto(3.0, chunk) * 0.002
        yield from zip(latency.tolist(), rng.exponential(0.0005, chunk).tolist())


def hstu_stats_message(worker: ActiveRun, node_id: str) -> bytes:
    """What a worker sends at each Locust report: its statistics since the last one."""
    from locust.rpc.protocol import Message

    data: dict = {}
    data["hstu"] = worker.figures.stats.take().to_dict()  # loadtest.hooks: report_to_master
    return Message("stats", data, node_id).serialize()


def receive(master: ActiveRun, payload: bytes) -> None:
    from locust.rpc.protocol import Message

    data = Message.unserialize(payload).data
    master.figures.stats.merge(RunStats.from_dict(data["hstu"]))  # loadtest.hooks: worker_report


def buckets(stats: RunStats) -> int:
    return sum(len(h.counts) for b in stats.bins.values() for h in (b.latency, b.corrected, b.lag, b.loop_lag))


def accounting_run(config: LoadTestConfig, master: ActiveRun, requests: int, workers: int, report_every: int,
                   users: int, progress) -> AccountingRun:
    runs = [ActiveRun.start(prepared_run(config, Placement(WorkerRole(), w, workers))) for w in range(workers)]
    stages = master.prepared.schedule.stages
    shapes = {s.key: step_shapes(s.key.goal_ratio, SHAPES, seed=10 + s.index) for s in stages}
    keys = [FreshKeys(start=(w + 1) << 40) for w in range(workers)]
    rng = np.random.default_rng(0)
    sent = [0] * workers
    run = AccountingRun(requests, workers, [], 0, 0, 0.0, 0)
    sample_every = max(requests // RSS_SAMPLES, 1)
    start, cpu0 = time.perf_counter(), time.process_time()
    done, step = 0, 0
    for stage in stages:
        end = requests * (stage.index + 1) // len(stages)
        warmup_until = done + (end - done) // 10  # the stage's first tenth is its warm-up
        shape_list = shapes[stage.key]
        timings = latencies(rng, stage.key.goal_ratio)
        while done < end:
            w = step % workers
            worker, shape = runs[w], shape_list[step % SHAPES]
            request, prime = keys[w].step(shape)
            kind = "warmup" if done < warmup_until else "measure"
            user = (step // workers) % users
            sends = [(request, kind, shape.label)]
            if prime is not None:  # a prime sent while the stage warms up counts as warm-up, as in user.py
                sends.insert(0, (prime, "warmup" if kind == "warmup" else "prime", shape.label + " (prime)"))
            for part, part_kind, label in sends:
                predicted = worker.live.fleet.predict(worker.live.fleet.route(part), part).hits
                latency, lag = next(timings)
                outcome = Outcome(latency, cached_tokens=np.array(predicted), verdict=OK_VERDICT, lag_s=lag)
                expected = (0,) * BATCH if part is prime else predicted
                worker.live.accountant.file(Sent(part_kind, stage.key, part, expected, predicted, outcome, label, user))
                done += 1
                sent[w] += 1
                if sent[w] % report_every == 0:
                    payload = hstu_stats_message(worker, f"worker{w}")
                    merge0 = time.perf_counter()
                    receive(master, payload)
                    run.merge_s += time.perf_counter() - merge0
                    run.reports_sent += 1
                    run.report_bytes += len(payload)
                if done % sample_every == 0:
                    records = sum(r.live.records.path.stat().st_size for r in runs)
                    run.samples.append(Sample(done, time.perf_counter() - start, time.process_time() - cpu0,
                                              rss_mib(), records / 2**20, buckets(master.figures.stats)))
                    progress(run.samples[-1])
            worker.live.fleet.retire(request.user_ids.tolist())  # the source settles the step
            step += 1
    for w, worker in enumerate(runs):  # the last report, as a worker sends at test stop
        receive(master, hstu_stats_message(worker, f"worker{w}"))
        run.records_bytes += worker.live.records.path.stat().st_size
        worker.close()
    return run


def accounting_table(run: AccountingRun) -> str:
    lines = ["| requests sent | wall s | CPU us/request so far | RSS MiB | records MiB | master histogram buckets |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {s.requests:,} | {s.elapsed_s:.1f} | {s.cpu_s / s.requests * 1e6:.1f} | {s.rss_mib:.1f} | "
              f"{s.records_mib:,.0f} | {s.master_buckets:,} |" for s in run.samples]
    return "\n".join(lines)


# -- the final report -----------------------------------------------------------------------

def final_report_s(master_runtime: LoadTestRuntime) -> float:
    from locust.env import Environment

    from hstu_replay.loadtest.finish import write_final_report

    environment = Environment()
    environment.hstu = master_runtime
    start = time.perf_counter()
    write_final_report(environment)
    return time.perf_counter() - start


def cost_breakdown(config: LoadTestConfig, n: int) -> list[tuple[str, float]]:
    """CPU us per measured request of each part of the bookkeeping, `n` requests each."""
    shapes = step_shapes(0.0, SHAPES, seed=3)
    stage, zeros = BinKey(BATCH, 0.0), (0,) * BATCH
    outcome = Outcome(0.012, cached_tokens=np.zeros(BATCH, dtype=np.int64), verdict=OK_VERDICT, lag_s=0.0004)
    model = CacheModel(None, 32)
    stats_only = ActiveRun.start(prepared_run(config, Placement(LocalRole())))
    stats_only.live.accountant.records = None
    with_records = ActiveRun.start(prepared_run(config, Placement(LocalRole())))

    def predict_and_retire(request: RequestTensors) -> None:
        model.predict(request)
        model.retire(request.user_ids.tolist())

    def filer(run: ActiveRun):
        return lambda request: run.live.accountant.file(Sent("measure", stage, request, zeros, zeros, outcome, "x", 0))

    def cpu_us(body) -> float:
        keys = FreshKeys()
        requests = [keys.step(shapes[i % SHAPES])[0] for i in range(n)]
        cpu0 = time.process_time()
        for request in requests:
            body(request)
        return (time.process_time() - cpu0) / n * 1e6

    rows = [("CacheModel.predict + retire", cpu_us(predict_and_retire)),
            ("Accountant.file, statistics only", cpu_us(filer(stats_only))),
            ("Accountant.file with its RecordWriter", cpu_us(filer(with_records)))]
    stats_only.close()
    with_records.close()
    with_records.live.records.path.unlink()
    return rows


def accounting_and_report(args, requests: int, out: Path) -> None:
    config = config_for(out)
    master_runtime = LoadTestRuntime(config, MasterRole())
    master_runtime.role.worker_count = args.workers
    master = master_runtime.begin(prepared_run(config, master_runtime.placement))
    print(f"\n## Accounting run: {requests:,} requests, {args.workers} workers, stages "
          f"{', '.join(s.key.name() for s in master.prepared.schedule.stages)}\n", flush=True)

    def progress(s: Sample) -> None:
        print(f"  {s.requests:,} requests, {s.elapsed_s:.0f} s, RSS {s.rss_mib:.1f} MiB", file=sys.stderr, flush=True)

    run = accounting_run(config, master, requests, args.workers, args.report_every, args.users, progress)
    last = run.samples[-1]
    print(accounting_table(run))
    print(f"\ntotal: {run.elapsed_s:.1f} s wall, {last.cpu_s:.1f} s CPU, {last.cpu_s / last.requests * 1e6:.1f} us "
          f"CPU/request; records {run.records_bytes / 2**20:,.0f} MiB ({run.records_bytes / last.requests:.0f} B/request); "
          f"{run.reports_sent} worker reports, {run.report_bytes / max(run.reports_sent, 1) / 1024:.1f} KiB each, "
          f"master merge {run.merge_s:.2f} s in all")
    print(f"memory: RSS {run.samples[0].rss_mib:.1f} MiB at {run.samples[0].requests:,} requests, "
          f"{last.rss_mib:.1f} MiB at {last.requests:,}: growth {run.rss_growth_mib:+.1f} MiB; "
          f"flat: {'yes' if run.flat else 'no'} (bound {FLAT_MIB:g} MiB)", flush=True)

    print("\n## Final report: loadtest.finish.write_final_report (JSON, CSV, SVG, HTML)\n", flush=True)
    seconds = final_report_s(master_runtime)
    sizes = {p.name: p.stat().st_size for p in sorted(out.glob("report*")) + sorted(out.glob("*.svg"))}
    merged = master.figures.stats
    print(f"\nfinal report written in {seconds:.2f} s from {sum(b.requests for b in merged.bins.values()):,} "
          f"measured requests in {len(merged.bins)} bins; files: "
          + ", ".join(f"{name} {size / 1024:.0f} KiB" for name, size in sizes.items()), flush=True)
    master_runtime.close()

    print("\n## Where a request's bookkeeping goes (batch 8, CPU us/request)\n")
    print("| part | CPU us/request |\n| --- | ---: |")
    for part, us in cost_breakdown(config, max(requests // 100, 10_000)):
        print(f"| {part} | {us:.1f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=FULL_REQUESTS, help="requests sent in the accounting run")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS:,} requests, smaller cache checkpoints")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-every", type=int, default=10_000,
                        help="requests a worker files between its reports to the master")
    parser.add_argument("--users", type=int, default=64, help="virtual users per worker")
    parser.add_argument("--budget-tokens", type=int, default=1 << 26, help="the budgeted cache model's capacity")
    parser.add_argument("--out-dir", default="", help="records and report here (default: a temporary folder, removed)")
    args = parser.parse_args()
    requests = QUICK_REQUESTS if args.quick else args.requests
    checkpoints = QUICK_CACHE_CHECKPOINTS if args.quick else CACHE_CHECKPOINTS
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}", flush=True)

    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="bookkeeping-scale-"))
    try:
        accounting_and_report(args, requests, out)
    finally:
        if not args.out_dir:
            shutil.rmtree(out, ignore_errors=True)

    # Last: the every-key-kept reference leaves this process's heap larger.
    rows = cache_model_scale("no budget, retired keys forgotten", CacheModel(None, 32), True, checkpoints)
    rows += cache_model_scale(f"budget {args.budget_tokens:,} tokens (LRU)", CacheModel(args.budget_tokens, 32),
                              True, checkpoints)
    rows += cache_model_scale("no budget, keys kept (reference)", CacheModel(None, 32), False,
                              tuple(c for c in checkpoints if c <= KEPT_REFERENCE_REQUESTS))
    print("\n## Cache model: predict + retire, batch 8, fresh keys per request\n")
    print(cache_table(rows), flush=True)
    print(f"\nuptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
