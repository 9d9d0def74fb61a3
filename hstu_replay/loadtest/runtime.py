"""Per-process state of a load test: config, sweep, capacity model, statistics, records.

One instance hangs off the Locust environment (`environment.hstu`). Statistics gathered here
are sent to the master by workers and merged there by addition.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.client.triton import ModelBinding
from hstu_replay.loadtest.options import LoadTestConfig
from hstu_replay.loadtest.records import RecordWriter
from hstu_replay.loadtest.schedule import Schedule, StagePosition
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.step import PlannedStep
from hstu_replay.stats.run_stats import RunStats
from hstu_replay.verify import Verdict


@dataclass
class Outcome:
    """What happened to one sent request."""

    latency_s: float
    logits: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None
    error: str = ""
    verdict: Verdict | None = None
    mismatch: str = ""  # one line naming request, user and difference, when the verdict fails
    lag_s: float | None = None  # open loop: actual send - intended send


@dataclass
class LoadTestRuntime:
    config: LoadTestConfig
    role: str  # local | master | worker
    worker_index: int = 0
    worker_count: int = 1
    binding: ModelBinding | None = None
    stats: RunStats = field(default_factory=RunStats)
    started_at: float = math.nan  # time.monotonic() at test start
    started_epoch: float = math.nan
    server_stages: dict = field(default_factory=dict)  # bin name -> Triton queue/compute split
    _users: itertools.count = field(default_factory=itertools.count)
    _store = None
    _dumps = None
    records: RecordWriter | None = None
    ledger: CacheLedger | None = None
    _clients: list = field(default_factory=list)

    def __post_init__(self):
        self.configure(self.config)

    def configure(self, config: LoadTestConfig) -> None:
        """(Re)read the options: the web UI may change them between runs."""
        self.config = config
        self.schedule = Schedule(config.batches, config.ratios, config.warmup_seconds, config.stage_seconds)

    def start(self) -> None:
        self.started_at, self.started_epoch = time.monotonic(), time.time()
        budget = self.config.cache_budget_tokens
        share = None if budget <= 0 else budget // max(self.worker_count, 1)
        self.ledger = CacheLedger(share, self.config.cache_page_tokens)
        self.stats = RunStats()
        if self.records is None and self.role != "master":
            self.records = RecordWriter(Path(self.config.report_dir), f"{self.role}{self.worker_index}")

    def position(self) -> StagePosition | None:
        if math.isnan(self.started_at):
            return None
        return self.schedule.at(time.monotonic() - self.started_at)

    def open_client(self):
        """A Triton client closed by `close()` at the latest: a gRPC channel left to the
        interpreter's teardown can hang the process at exit."""
        from hstu_replay.client.triton import TritonClient

        client = TritonClient(self.config.client_options())
        client.binding = self.binding
        self._clients.append(client)
        return client

    def new_user_index(self) -> int:
        return next(self._users)

    def keys_for(self, user_index: int) -> KeyAllocator:
        return KeyAllocator(self.worker_index, user_index)

    # -- workload data, loaded once per process ---------------------------------------

    @property
    def store(self):
        if self._store is None:
            from hstu_replay.data.store import SequenceStore

            self._store = SequenceStore.open(self.config.store)
        return self._store

    @property
    def dump_pool(self) -> list:
        """Every dumped user with its reference rows (see plan.dumps)."""
        if self._dumps is None:
            from hstu_replay.dumps.reader import read_dump
            from hstu_replay.plan.dumps import dumped_users

            self._dumps = dumped_users(read_dump(self.config.dump_dir))
        return self._dumps

    # -- accounting -------------------------------------------------------------------

    def predict_hits(self, step_request) -> tuple[int, ...]:
        pairs = list(zip(step_request.user_ids.tolist(), step_request.total_history_lengths.tolist()))
        return self.ledger.serve(pairs).hits

    def forget(self, request) -> None:
        for key in request.user_ids.tolist():
            self.ledger.forget(key)

    def account(self, kind: str, step: PlannedStep, position: StagePosition, predicted: tuple[int, ...],
                outcome: Outcome, user_index: int) -> None:
        stage = position.stage
        record = {
            "t": time.time() - outcome.latency_s, "latency_ms": outcome.latency_s * 1e3, "kind": kind,
            "stage": stage.key.name(), "batch": step.request.batch_size, "target": stage.key.target_ratio,
            "tokens": step.history_tokens, "expected_hits": sum(step.expected_hits),
            "predicted_hits": sum(predicted),
            "observed_hits": None if outcome.cached_tokens is None else int(outcome.cached_tokens.sum()),
            "ok": not outcome.error, "error": outcome.error or None, "label": step.label,
            "worker": self.worker_index, "user": user_index,
        }
        if outcome.verdict is not None:
            record["max_abs_diff"] = outcome.verdict.max_abs_diff
        if outcome.lag_s is not None:
            record["lag_ms"] = outcome.lag_s * 1e3
        if self.records:
            self.records.write(record)
        if kind == "prime":
            self.stats.prime_requests += 1
            self.stats.prime_failures += bool(outcome.error)
            return
        if kind == "warmup":
            self.stats.warmup_requests += 1
            return
        b = self.stats.bin(stage.key)
        now = time.time()
        b.first_start = min(b.first_start, now - outcome.latency_s)
        b.last_end = max(b.last_end, now)
        if outcome.error:
            b.failures += 1
            self.stats.count_error(outcome.error)
            return
        b.latency.record(outcome.latency_s)
        if outcome.lag_s is not None:
            b.lag.record(outcome.lag_s)
            b.corrected.record(outcome.lag_s + outcome.latency_s)
        b.requests += 1
        b.logical_requests += step.request.batch_size
        b.history_tokens += step.history_tokens
        b.expected_hits += sum(step.expected_hits)
        b.predicted_hits += sum(predicted)
        if outcome.cached_tokens is not None:
            observed = int(outcome.cached_tokens.sum())
            b.observed_hits += observed
            b.observed_tokens += step.history_tokens
            b.hit_disagreements += observed != sum(predicted)
            b.hits_lost += observed < sum(predicted)
        if outcome.verdict is not None:
            b.verified += 1
            if not outcome.verdict.ok:
                b.mismatches += 1
                self.stats.count_error(outcome.mismatch)

    def close(self) -> None:
        while self._clients:
            self._clients.pop().close()
        if self.records:
            self.records.close()
            self.records = None
