"""What each sent request did to the figures: one exact record, and the stage's counters.

`Accountant` is the only writer of a process's `RunStats` and records file during a run. It
knows nothing of Locust or of how requests are sent: the load generator hands it a finished
`Sent` and it files it under its stage.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hstu_replay.plan.tiers import tier_of
from hstu_replay.request import RequestTensors
from hstu_replay.stats.run_stats import BinKey, RunStats
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
    refused: bool = False  # the server was not there to take it (see client.ServerUnavailable)
    host_cached_tokens: np.ndarray | None = None  # the part of cached_tokens onboarded from the host tier

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class Sent:
    """One request as the accountant files it."""

    kind: str  # prime | warmup | measure
    stage: BinKey
    request: RequestTensors
    expected_hits: tuple[int, ...]  # what the plan aimed at (0s for a prime)
    predicted_hits: tuple[int, ...]  # what the client's cache model said the server held
    outcome: Outcome
    label: str
    user: int  # virtual user index in its process
    predicted_host_hits: tuple[int, ...] = ()  # the part of predicted_hits the model onboards from the host
    server: int = -1  # the fleet's server it went to (-1: the only server)


class RecordSink(Protocol):
    def write(self, record: dict) -> None: ...


class Accountant:
    def __init__(self, stats: RunStats, records: RecordSink | None, worker_index: int):
        self.stats, self.records, self.worker_index = stats, records, worker_index

    def file(self, sent: Sent) -> None:
        outcome, request = sent.outcome, sent.request
        tokens = int(request.total_history_lengths.sum())
        if self.records is not None:
            self.records.write(self._record(sent, tokens))
        if sent.kind == "warmup":
            self.stats.warmup_requests += 1
            return
        if not outcome.ok:
            self.stats.count_error(f"prime: {outcome.error}" if sent.kind == "prime" else outcome.error)
        self._file_into(self.stats.bin(sent.stage), sent, tokens)
        if sent.server >= 0:  # a fleet's server: its figures, its tiers left to the stage's
            self._file_into(self.stats.server_bin(sent.stage, sent.server), sent, tokens, tiers=False)
        if outcome.verdict is not None and not outcome.verdict.ok:
            self.stats.count_error(outcome.mismatch)

    def _file_into(self, b, sent: Sent, tokens: int, tiers: bool = True) -> None:
        """`sent` added to one bin's counters (the stage's, or its server's: `tiers` False)."""
        outcome, request = sent.outcome, sent.request
        if sent.kind == "prime":
            b.prime_requests += 1
            b.prime_failures += not outcome.ok
            b.prime_tokens += tokens - sum(sent.predicted_hits) if outcome.ok else 0
            return
        now = time.time()
        b.first_start = min(b.first_start, now - outcome.latency_s)
        b.last_end = max(b.last_end, now)
        if not outcome.ok:
            b.errors += 1
            return
        b.latency.record(outcome.latency_s)
        if outcome.lag_s is not None:
            b.lag.record(outcome.lag_s)
            b.corrected.record(outcome.lag_s + outcome.latency_s)
        b.requests += 1
        b.logical_requests += request.batch_size
        b.history_tokens += tokens
        b.expected_hits += sum(sent.expected_hits)
        predicted = sum(sent.predicted_hits)
        b.predicted_hits += predicted
        hits = predicted
        if outcome.cached_tokens is not None:
            observed = int(outcome.cached_tokens.sum())
            b.observed_hits += observed
            b.observed_tokens += tokens
            b.hit_disagreements += observed != predicted
            b.hits_lost += observed < predicted
            hits = observed
        b.computed_tokens += tokens - hits
        if tiers:
            self._file_tiers(b, sent, tokens)
        if outcome.verdict is not None:
            b.verified += 1
            b.mismatches += not outcome.verdict.ok

    @staticmethod
    def _file_tiers(b, sent: Sent, tokens: int) -> None:
        """Tokens and users per tier: the model's always, the server's where it sends HOST_CACHED_TOKENS."""
        host = sent.predicted_host_hits or (0,) * len(sent.predicted_hits)
        b.predicted_host_hits += sum(host)
        for tier, users in Counter(map(tier_of, sent.predicted_hits, host)).items():
            b.add_tier_user("predicted", tier, users)
        outcome = sent.outcome
        if outcome.cached_tokens is None or outcome.host_cached_tokens is None:
            return
        b.observed_host_hits += int(outcome.host_cached_tokens.sum())
        b.observed_tier_tokens += tokens
        observed = map(tier_of, outcome.cached_tokens.tolist(), outcome.host_cached_tokens.tolist())
        for tier, users in Counter(observed).items():
            b.add_tier_user("observed", tier, users)

    def _record(self, sent: Sent, tokens: int) -> dict:
        outcome = sent.outcome
        record = {
            "t": time.time() - outcome.latency_s, "latency_ms": outcome.latency_s * 1e3, "kind": sent.kind,
            "stage": sent.stage.name(), "batch": sent.request.batch_size, "target": sent.stage.goal_ratio,
            "tokens": tokens, "keys": sent.request.user_ids.tolist(),
            "expected_hits": sum(sent.expected_hits), "predicted_hits": sum(sent.predicted_hits),
            "observed_hits": None if outcome.cached_tokens is None else int(outcome.cached_tokens.sum()),
            "predicted_host_hits": sum(sent.predicted_host_hits),
            "observed_host_hits": (None if outcome.host_cached_tokens is None
                                   else int(outcome.host_cached_tokens.sum())),
            "ok": outcome.ok, "error": outcome.error or None, "label": sent.label,
            "worker": self.worker_index, "user": sent.user,
        }
        if sent.server >= 0:
            record["server"] = sent.server
        if outcome.verdict is not None:
            record["max_abs_diff"] = outcome.verdict.max_abs_diff
            record["mismatch"] = not outcome.verdict.ok
        if outcome.lag_s is not None:
            record["lag_ms"] = outcome.lag_s * 1e3
        return record
