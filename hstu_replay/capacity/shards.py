"""One step of `capacity natural` with n servers, from its shards' measurements.

Each server gets one shard of the users (`--timeline-shard i/n`). The step meets the SLO only if
every shard does, so its latency and error ratio are the worst shard's; its throughput is the
sum, and its hit ratio the shards' hit tokens over their history tokens.
"""

from __future__ import annotations

from dataclasses import replace

from hstu_replay.capacity.search import Measurement


def _present(values) -> list[float]:
    return [v for v in values if v is not None]


def _worst(values) -> float | None:
    present = _present(values)
    return max(present) if present and len(present) == len(values) else None


def _total(values) -> float | None:
    present = _present(values)
    return sum(present) if present and len(present) == len(values) else None


def combined_ratio(ratios: list[float | None], tokens: list[int | None]) -> float | None:
    """Hit tokens over history tokens of the shards together (each shard's ratio weighted by its
    tokens); None when a shard's is unknown."""
    if not ratios or any(r is None for r in ratios) or any(t is None for t in tokens):
        return None
    total = sum(tokens)
    return sum(r * t for r, t in zip(ratios, tokens)) / total if total else None


def combine(shards: list[Measurement]) -> Measurement:
    """The step's measurement: the worst shard for the SLO (p50, p99, error ratio), the sum for
    requests and throughput, the token-weighted hit ratio; the first shard's problem, if any."""
    first = shards[0]
    if len(shards) == 1:
        return first
    sources = {m.hit_source for m in shards}
    requests = sum(m.requests for m in shards)
    means = [m.mean_ms for m in shards]
    return replace(
        first, requests=requests, throughput_rps=_total([m.throughput_rps for m in shards]),
        logical_throughput=_total([m.logical_throughput for m in shards]),
        mean_ms=(sum(m.mean_ms * m.requests for m in shards) / requests
                 if requests and None not in means else None),
        p50_ms=_worst([m.p50_ms for m in shards]), p99_ms=_worst([m.p99_ms for m in shards]),
        error_ratio=_worst([m.error_ratio for m in shards]),
        achieved_ratio=combined_ratio([m.achieved_ratio for m in shards], [m.history_tokens for m in shards]),
        history_tokens=_total([m.history_tokens for m in shards]),
        hit_source=sources.pop() if len(sources) == 1 else "mixed",
        server_rps=_total([m.server_rps for m in shards]),
        requested_rps=_total([m.requested_rps for m in shards]),
        client_bound=any(m.client_bound for m in shards), server=None, metrics=None, report_dir=None,
        problem=next((m.problem for m in shards if m.problem), None),
        returncode=next((m.returncode for m in shards if m.returncode), first.returncode),
    )


def spread(values: list[float | None]) -> dict | None:
    """Lowest and highest of the known values, and how many there are."""
    present = _present(values)
    if not present:
        return None
    return {"min": min(present), "max": max(present), "shards": len(present)}
