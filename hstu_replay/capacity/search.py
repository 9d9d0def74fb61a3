"""The capacity search, as pure logic: judge a step against the SLO, step until it breaks,
and read the sustainable throughput, the knee and the fleet size off the steps.

Nothing here runs Locust or talks to a server: `step_until_breach` takes the function that
measures one step, so the search is tested with hand-worked numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: slack for float noise in ceil(target / throughput): 100 / 25.000000000000004 must stay 4
_CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class Slo:
    """The service-level objective every step is judged against."""

    p99_ms: float
    error_ratio: float = 0.01


@dataclass(frozen=True)
class Measurement:
    """What one step's report says (the single bin of a one-stage Locust run).

    `mean_ms`/`p50_ms`/`p99_ms` are the latencies judged: for open loop, from the intended send
    time (`latency_basis` "intended"), else from the actual send ("sent"). None: not measured.
    """

    load: float
    requests: int = 0
    throughput_rps: float | None = None
    logical_throughput: float | None = None
    mean_ms: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    error_ratio: float | None = None
    achieved_ratio: float | None = None
    hit_source: str | None = None  # observed (server-reported) or predicted (client model)
    history_tokens: int | None = None  # history tokens of the measured requests: the hit ratio's weight
    primes_per_request: float | None = None  # priming requests the server also served, per measured one
    server_rps: float | None = None  # measured plus priming requests per second: the server's whole work
    client_cpu_ms_per_request: float | None = None  # load-generator CPU per measured request (primes in it)
    client_bound: bool = False  # the report flagged the step client-bound: the client may have been the limit
    latency_basis: str = "sent"
    requested_rps: float | None = None
    server: dict | None = None  # the report's Triton statistics split of the measured window
    metrics: dict | None = None  # Prometheus deltas over the whole step (metrics.pages)
    errors: dict | None = None  # the report's most frequent error reasons -> count
    report_dir: str | None = None
    returncode: int | None = None
    problem: str | None = None  # why the step has no figures (timed out, no report, ...)

    @property
    def power(self) -> float | None:
        """Throughput over mean latency, requests/s per second of latency (Kleinrock's power)."""
        if self.throughput_rps is None or not self.mean_ms or self.mean_ms <= 0:
            return None
        return self.throughput_rps / (self.mean_ms / 1e3)


@dataclass(frozen=True)
class StepResult:
    measurement: Measurement
    breaches: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.breaches

    @property
    def load(self) -> float:
        return self.measurement.load


def breaches(m: Measurement, slo: Slo) -> tuple[str, ...]:
    """Every way `m` misses the SLO, one phrase each; empty when it meets it."""
    if m.problem:
        return (m.problem,)
    if not m.requests or m.p99_ms is None:
        return ("no request was measured",)
    out = []
    if m.p99_ms > slo.p99_ms:
        out.append(f"p99 {m.p99_ms:.3f} ms > {slo.p99_ms:g} ms")
    if m.error_ratio is not None and m.error_ratio > slo.error_ratio:
        out.append(f"error ratio {m.error_ratio:.4f} > {slo.error_ratio:g}")
    return tuple(out)


def judge(m: Measurement, slo: Slo) -> StepResult:
    return StepResult(m, breaches(m, slo))


def step_until_breach(loads: Iterable[float], measure: Callable[[float], Measurement], slo: Slo,
                      on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    """Measure each load in order; the first step that breaks the SLO is kept and ends the search.

    Bounded by len(loads): every load is measured at most once.
    """
    steps: list[StepResult] = []
    for load in loads:
        step = judge(measure(load), slo)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if not step.passed:
            break
    return steps


def sustainable(steps: Sequence[StepResult]) -> StepResult | None:
    """The SLO-passing step with the highest logical throughput; None when no step passed."""
    passing = [s for s in steps if s.passed and s.measurement.logical_throughput is not None]
    return max(passing, key=lambda s: s.measurement.logical_throughput, default=None)


def knee(steps: Sequence[StepResult]) -> StepResult | None:
    """The step of maximum power (throughput / mean latency) among every measured step.

    Beyond the knee, extra load buys less throughput than it costs in latency. It is taken over
    all steps, the breaching one included, so it can lie past the SLO: the step says so.
    """
    powered = [s for s in steps if s.measurement.power is not None]
    return max(powered, key=lambda s: s.measurement.power, default=None)


def servers_needed(target_rps: float | None, sustainable_logical_rps: float | None) -> int | None:
    """ceil(target / sustainable throughput per server); None without a target or a passing step."""
    if target_rps is None or sustainable_logical_rps is None or not sustainable_logical_rps > 0:
        return None
    return max(1, math.ceil(target_rps / sustainable_logical_rps - _CEIL_SLACK))


def slo_crossing(steps: Sequence[StepResult], slo: Slo) -> float | None:
    """The load at which p99 reaches the SLO, linear between the last passing step and the step
    that broke it by p99 (a straight line between two measured points: an estimate, not a
    measurement); None where the search did not break by p99 after a passing step."""
    low = next((s for s in reversed(steps) if s.passed), None)
    breach = next((s for s in steps if not s.passed), None)
    if low is None or breach is None:
        return None
    low, high = low.measurement, breach.measurement
    if low.p99_ms is None or high.p99_ms is None or not low.p99_ms < slo.p99_ms < high.p99_ms:
        return None  # broken by errors, or with no p99 to interpolate on
    return low.load + (slo.p99_ms - low.p99_ms) * (high.load - low.load) / (high.p99_ms - low.p99_ms)


#: Above this many priming requests per measured one, a ratio's hits came from priming.
PRIMED = 0.05


@dataclass(frozen=True)
class RatioResult:
    """The search at one hit ratio."""

    hit_ratio: float
    steps: tuple[StepResult, ...]
    sustainable: StepResult | None = None
    knee: StepResult | None = None
    servers_needed: int | None = None

    @property
    def hits_from(self) -> str | None:
        """How the sustainable step's traffic got its hits: `reuse` (keys that come back, as real
        users do), `priming` (more than PRIMED priming requests per measured one, on fresh keys,
        which the server computed too: its fleet size is an upper bound), or `none` (a cold ratio)."""
        best = self.sustainable
        if best is None:
            return None
        if self.hit_ratio == 0:
            return "none"
        primes = best.measurement.primes_per_request
        return "priming" if primes is not None and primes > PRIMED else "reuse"

    @property
    def within_slo(self) -> StepResult | None:
        """The highest load that met the SLO: the last passing step (loads ascend, the search stops at
        the first breach); it may carry less than `sustainable` where throughput fell before p99 broke."""
        return next((s for s in reversed(self.steps) if s.passed), None)

    @property
    def stopped_at(self) -> StepResult | None:
        """The step that broke the SLO (None when every load passed)."""
        return next((s for s in self.steps if not s.passed), None)


def summarize(hit_ratio: float, steps: Sequence[StepResult], target_rps: float | None) -> RatioResult:
    best = sustainable(steps)
    logical = best.measurement.logical_throughput if best else None
    return RatioResult(hit_ratio, tuple(steps), best, knee(steps), servers_needed(target_rps, logical))
