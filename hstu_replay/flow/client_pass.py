"""Replay a reference dump through a served KV-cache model, as NVIDIA's replay client does, and
check every response against the dump's reference logits.

Batch 0 is the warm-up (sent, checked, left out of both passes); then, after a pause, batches
1..N are sent one after another twice on the same cache keys: pass 1 cold, pass 2 cached. Every
response is compared with the reference (`verify.compare`); where the server reports the tokens
each user reused (CACHED_TOKENS), each pass's hit ratio is the server's word. One line per
request goes to a JSONL record as it is answered. A request the server does not answer ends the
replay there. Torch-free: it drives any server with the interface.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO

import numpy as np
import orjson

from hstu_replay.client.triton import TritonClient
from hstu_replay.dumps.reader import DumpBatch
from hstu_replay.errors import HstuReplayError, InputError
from hstu_replay.request import RequestTensors
from hstu_replay.verify import compare

PASSES = ("cold", "cached")


@dataclass(frozen=True)
class Case:
    """One request of the replay and what came back."""

    batch: str
    phase: str  # "warmup", "cold" or "cached"
    ok: bool  # answered and within the tolerance
    max_abs_diff: float | None  # None when there was no answer
    worst_user: int
    latency_ms: float | None
    history_tokens: int
    cached_tokens: int | None  # the server's word, when it reports it
    error: str = ""

    def describe(self) -> str:
        where = f"{self.batch} ({self.phase})"
        if self.error:
            return f"{where}: {self.error}"
        return f"{where}: max |diff| {self.max_abs_diff:.4g} at user {self.worst_user}"


@dataclass(frozen=True)
class PassResult:
    phase: str
    cases: tuple[Case, ...]
    seconds: float  # wall time of the pass, request after request

    @property
    def failed(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if not c.ok)

    @property
    def hit_ratio(self) -> float | None:
        """Cached / history tokens over the pass, when the server reported every request's hits."""
        if not self.cases or any(c.cached_tokens is None for c in self.cases):
            return None
        history = sum(c.history_tokens for c in self.cases)
        return sum(c.cached_tokens or 0 for c in self.cases) / history if history else 0.0

    def summary(self) -> dict:
        answered = [c for c in self.cases if c.max_abs_diff is not None]
        return {"phase": self.phase, "requests": len(self.cases), "verified": len(answered),
                "mismatches": sum(1 for c in answered if not c.ok), "errors": sum(1 for c in self.cases if c.error),
                "seconds": round(self.seconds, 4),
                "max_abs_diff": max((c.max_abs_diff for c in answered), default=None),
                "hit_ratio": self.hit_ratio, "hit_source": "observed" if self.hit_ratio is not None else None}


@dataclass(frozen=True)
class ReplayOutcome:
    warmup: PassResult
    passes: tuple[PassResult, ...]  # cold, cached (fewer when the server stopped answering)

    @property
    def failed(self) -> tuple[Case, ...]:
        return self.warmup.failed + tuple(c for p in self.passes for c in p.failed)

    @property
    def ok(self) -> bool:
        return not self.failed and len(self.passes) == len(PASSES)


def replay_dump(client: TritonClient, batches: Sequence[DumpBatch], tolerance: float, pause_s: float,
                records: IO[bytes]) -> ReplayOutcome:
    """Warm-up on batch 0, pause, then the two passes over batches 1..N."""
    if len(batches) < 2:
        raise InputError(f"the dump has {len(batches)} batch(es); the replay needs a warm-up and at least one more")
    requests = [(b, _request(b)) for b in batches]
    warmup = _pass("warmup", requests[:1], client, tolerance, records)
    passes: list[PassResult] = []
    if not any(c.error for c in warmup.cases):
        time.sleep(pause_s)
        for phase in PASSES:
            result = _pass(phase, requests[1:], client, tolerance, records)
            passes.append(result)
            if any(c.error for c in result.cases):
                break
    return ReplayOutcome(warmup, tuple(passes))


def _request(batch: DumpBatch) -> RequestTensors:
    missing = [k for k in ("user_ids", "total_history_lengths") if k not in batch.tensors]
    if missing or batch.logits is None:
        raise InputError(f"{batch.name} lacks {', '.join(missing) or 'reference logits'}: "
                         f"a KV-cache replay needs the KV-cache exporter's dump")
    t = batch.tensors
    return RequestTensors.of(t["values"], t["lengths"], t["num_candidates"], t["user_ids"],
                             t["total_history_lengths"])


def _pass(phase: str, requests: Sequence[tuple[DumpBatch, RequestTensors]], client: TritonClient,
          tolerance: float, records: IO[bytes]) -> PassResult:
    cases: list[Case] = []
    started = time.perf_counter()
    for batch, tensors in requests:
        history = int(tensors.total_history_lengths.sum())
        try:
            response = client.infer(tensors)
        except HstuReplayError as exc:
            case = Case(batch=batch.name, phase=phase, ok=False, max_abs_diff=None, worst_user=-1, latency_ms=None,
                        history_tokens=history, cached_tokens=None, error=str(exc))
        else:
            verdict = compare(response.logits, batch.logits, tensors.num_candidates, tolerance)
            cached = None if response.cached_tokens is None else int(np.sum(response.cached_tokens))
            case = Case(batch=batch.name, phase=phase, ok=verdict.ok, max_abs_diff=verdict.max_abs_diff,
                        worst_user=verdict.worst_user, latency_ms=round(response.latency_s * 1000, 3),
                        history_tokens=history, cached_tokens=cached, error=verdict.reason)
        records.write(orjson.dumps(asdict(case)) + b"\n")
        records.flush()
        cases.append(case)
        if case.error and case.max_abs_diff is None:
            break
    return PassResult(phase, tuple(cases), time.perf_counter() - started)
