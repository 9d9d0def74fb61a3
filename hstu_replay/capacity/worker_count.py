"""How many Locust worker processes a request rate needs, from the client CPU a request costs.

A worker is one process: its users share one event loop, so it uses one core at most. It is
planned to use `core_share` of that core (0.7 by default): a worker near a whole core sends late
and its stages are flagged client-bound (report.flags). The cost of a request is the load
generator's CPU per measured request of the sustainable step (its report's
`client_cpu_ms_per_request`, the primes those requests needed included).

A Locust master is not in that figure and not in the count: it sends no request and merges the
workers' reports every few seconds (3 s in Locust), a cost per report, not per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hstu_replay.capacity.search import RatioResult

DEFAULT_CORE_SHARE = 0.7
#: slack for float noise: 10,000 req/s x 0.42 ms is 4.2 cores, / 0.7 is 6.000000000000001: still 6
_CEIL_SLACK = 1e-9
MASTER_NOTE = ("the workers needed leave out a Locust master (distributed runs): one more process, which sends "
               "nothing and merges the workers' reports every few seconds, a cost per report, not per request")


def workers_needed(rate_rps: float, cpu_ms_per_request: float, core_share: float = DEFAULT_CORE_SHARE) -> int:
    """ceil(cores the rate keeps busy / the share of a core one worker may use), at least 1."""
    cores = rate_rps * cpu_ms_per_request / 1e3
    return max(1, math.ceil(cores / core_share - _CEIL_SLACK))


@dataclass(frozen=True)
class WorkerPlan:
    """The Locust workers one hit ratio needs to send a rate."""

    rate_rps: float  # requests/s to send, each a batch of `batch_size` users
    basis: str  # "target": --target-rps / batch size; "sustainable": one server's sustainable step
    cpu_ms_per_request: float  # load-generator CPU per request, measured in the sustainable step
    core_share: float  # of one core, per worker
    workers: int
    client_bound: bool  # the step it was measured in was flagged client-bound


def plan_workers(ratio: RatioResult, batch_size: int, target_rps: float | None,
                 core_share: float = DEFAULT_CORE_SHARE) -> WorkerPlan | None:
    """Workers for the target's requests/s (logical target / batch size), or without a target for
    the sustainable step's own rate; None without a sustainable step or a measured client CPU."""
    best = ratio.sustainable
    if best is None:
        return None
    m = best.measurement
    cpu = m.client_cpu_ms_per_request
    if cpu is None or not cpu > 0:
        return None
    if target_rps is not None:
        rate, basis = target_rps / batch_size, "target"
    elif m.throughput_rps is not None:
        rate, basis = m.throughput_rps, "sustainable"
    else:
        return None
    return WorkerPlan(rate, basis, cpu, core_share, workers_needed(rate, cpu, core_share), m.client_bound)
