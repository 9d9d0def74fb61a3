"""The timed part of NVIDIA's protocol: one warm-up call, a sleep, then timed passes.

For each model and batch size: case 0 is sent once as warm-up and left out; the client sleeps
(1 s in NVIDIA's client; not timed); then every other case is sent one after another, one call
in flight, and the pass's end-to-end time is the wall clock from before the first call to after
the last answer. A model with a KV cache gets two passes over the same cases and keys (pass 1
finds nothing cached, pass 2 finds every history cached); a model without one gets `repeats`
passes, averaged (NVIDIA's Python-backend client repeats three times). Loading, re-batching,
key generation and checking the answers happen outside the timed window.

    latency per logical request = end-to-end time / (Triton calls x logical batch size)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hstu_replay.client.triton import InferResponse
from hstu_replay.protocol.cases import Case
from hstu_replay.request import RequestTensors
from hstu_replay.verify import DEFAULT_TOLERANCE, compare

COLD, CACHED = "cold", "cached"


@dataclass(frozen=True)
class PassResult:
    """One timed pass over the measured cases of one (model, batch size)."""

    model: str
    batch_size: int
    name: str  # "cold", "cached", or "repeat N" for a model without a cache
    calls: int
    e2e_s: float  # wall clock around the pass: first call out .. last answer in
    wire_s: float  # sum of each call's time on the wire
    history_tokens: int  # history tokens sent (what a cache could hold)
    cached_tokens: int | None  # tokens the server said it reused (our target's CACHED_TOKENS); None: not reported
    verified: int  # answers compared with a reference (the dump's, or pass 1's for a cached pass)
    mismatches: int
    max_abs_diff: float | None
    server_calls: int | None  # Triton's count of the model's successful requests during the pass

    @property
    def logical_requests(self) -> int:
        return self.calls * self.batch_size

    @property
    def ms_per_logical_request(self) -> float:
        return self.e2e_s * 1e3 / self.logical_requests

    @property
    def cached_fraction(self) -> float | None:
        if self.cached_tokens is None or not self.history_tokens:
            return None
        return self.cached_tokens / self.history_tokens

    def to_json(self) -> dict:
        return {"model": self.model, "batch_size": self.batch_size, "pass": self.name, "calls": self.calls,
                "logical_requests": self.logical_requests, "e2e_s": self.e2e_s, "wire_s": self.wire_s,
                "ms_per_logical_request": self.ms_per_logical_request, "history_tokens": self.history_tokens,
                "cached_tokens": self.cached_tokens, "cached_fraction": self.cached_fraction,
                "verified": self.verified, "mismatches": self.mismatches, "max_abs_diff": self.max_abs_diff,
                "server_calls": self.server_calls}


@dataclass(frozen=True)
class Caller:
    """What the passes need from a client: one call, and the server's count of answered calls
    (None where the server does not say)."""

    infer: Callable[[RequestTensors], InferResponse]
    served_count: Callable[[], int | None]


def run_passes(caller: Caller, model: str, cases: Sequence[Case], caches: bool, repeats: int = 3,
               sleep_s: float = 1.0, tolerance: float = DEFAULT_TOLERANCE,
               clock: Callable[[], float] = time.perf_counter) -> list[PassResult]:
    """Warm-up on `cases[0]`, sleep, then the timed passes over `cases[1:]`."""
    caller.infer(cases[0].tensors)
    time.sleep(sleep_s)
    measured = cases[1:]
    names = [COLD, CACHED] if caches else [f"repeat {i + 1}" for i in range(repeats)]
    results: list[PassResult] = []
    first: list[np.ndarray] | None = None
    for name in names:
        before = settled_count(caller.served_count)
        start = clock()
        answers = [caller.infer(case.tensors) for case in measured]
        e2e = clock() - start
        after = None if before is None else settled_count(caller.served_count, before + len(measured))
        # everything below is outside the timed window
        checks = [(a.logits, c.reference, c) for a, c in zip(answers, measured) if c.reference is not None]
        if name == CACHED and first is not None:  # a hit must give the cold answer again
            checks += [(a.logits, f, c) for a, f, c in zip(answers, first, measured)]
        verdicts = [compare(logits, ref, case.tensors.num_candidates, tolerance) for logits, ref, case in checks]
        cached = [a.cached_tokens for a in answers]
        results.append(PassResult(
            model=model, batch_size=measured[0].batch_size, name=name, calls=len(measured), e2e_s=e2e,
            wire_s=sum(a.latency_s for a in answers),
            history_tokens=int(sum(int(c.tensors.total_history_lengths.sum()) for c in measured)),
            cached_tokens=None if any(c is None for c in cached) else int(sum(int(c.sum()) for c in cached)),
            verified=len(verdicts), mismatches=sum(not v.ok for v in verdicts),
            max_abs_diff=max((v.max_abs_diff for v in verdicts), default=None),
            server_calls=None if before is None or after is None else after - before,
        ))
        if first is None:
            first = [a.logits for a in answers]
    return results


def settled_count(count: Callable[[], int | None], at_least: int | None = None, limit_s: float = 2.0,
                  poll_s: float = 0.02) -> int | None:
    """The server's count once it stops moving: Triton counts a request a moment after its answer
    is sent, so a count read at once can miss the last call of a pass. Reads until two in a row
    agree (and reach `at_least`, when given), for at most `limit_s`."""
    last = count()
    deadline = time.monotonic() + limit_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(poll_s)
        now = count()
        if now == last and (at_least is None or now >= at_least):
            break
        last = now
    return last


def mean_pass(results: Sequence[PassResult]) -> PassResult:
    """The average of repeated passes (NVIDIA averages its Python-backend client's three): times,
    cached tokens and server calls per pass are means; verified answers and mismatches add up."""
    head = results[0]
    n = len(results)
    diffs = [r.max_abs_diff for r in results if r.max_abs_diff is not None]
    return PassResult(
        model=head.model, batch_size=head.batch_size, name=f"mean of {n}" if n > 1 else head.name,
        calls=head.calls, e2e_s=math.fsum(r.e2e_s for r in results) / n,
        wire_s=math.fsum(r.wire_s for r in results) / n, history_tokens=head.history_tokens,
        cached_tokens=None if any(r.cached_tokens is None for r in results)
        else round(sum(r.cached_tokens for r in results) / n),
        verified=sum(r.verified for r in results), mismatches=sum(r.mismatches for r in results),
        max_abs_diff=max(diffs) if diffs else None,
        server_calls=None if any(r.server_calls is None for r in results)
        else round(sum(r.server_calls for r in results) / n),
    )
