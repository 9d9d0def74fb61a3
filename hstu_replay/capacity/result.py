"""What capacity.json holds: the plan, and per hit ratio (and pools) its steps, its sustainable
step, knee, fleet size and workers, as one dict that every capacity output reads.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import hstu_replay
from hstu_replay.capacity.driver import CapacityPlan, CapacityResult
from hstu_replay.capacity.pools import TargetPools
from hstu_replay.capacity.search import RatioResult, StepResult, slo_crossing
from hstu_replay.capacity.worker_count import plan_workers
from hstu_replay.output.files import jsonable

#: What a ratio's fleet size means, by where its hits came from.
SERVERS_BASIS = {
    "none": "measured traffic, cold cache",
    "reuse": "measured traffic whose hits come from reused keys",
    "priming": "upper bound: the server also computed priming requests (primes_per_request: how many per "
               "measured one)",
}


def step_dict(step: StepResult, out_dir: Path) -> dict:
    """One step as capacity.json's `steps` list it, its report dir relative to `out_dir`."""
    m = step.measurement
    report_dir = m.report_dir
    if report_dir is not None:
        try:
            report_dir = str(Path(report_dir).resolve().relative_to(out_dir.resolve()))
        except ValueError:
            pass
    return {
        "load": m.load, "passed": step.passed, "breaches": list(step.breaches),
        "requests": m.requests, "throughput_rps": m.throughput_rps, "logical_throughput": m.logical_throughput,
        "requested_rps": m.requested_rps, "mean_ms": m.mean_ms, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms,
        "latency_basis": m.latency_basis, "error_ratio": m.error_ratio, "achieved_ratio": m.achieved_ratio,
        "hit_source": m.hit_source, "primes_per_request": m.primes_per_request, "server_rps": m.server_rps,
        "power": m.power, "client_cpu_ms_per_request": m.client_cpu_ms_per_request, "client_bound": m.client_bound,
        "server": m.server, "metrics": m.metrics, "errors": m.errors,
        "report_dir": report_dir, "returncode": m.returncode,
    }


def _pick(step: StepResult | None, *keys: str) -> dict | None:
    if step is None:
        return None
    m = step.measurement
    return {"load": m.load, "passed": step.passed, **{k: getattr(m, k) for k in keys}}


def _ratio(r: RatioResult, plan: CapacityPlan, pools: TargetPools | None) -> dict:
    stopped = r.stopped_at
    workers = plan_workers(r, plan.batch_size, plan.target_rps, plan.worker_cpu_share)
    return {
        "hit_ratio": r.hit_ratio,
        "pools": None if pools is None else pools.as_dict(),
        "steps": [step_dict(s, plan.out_dir) for s in r.steps],
        "sustainable": _pick(r.sustainable, "throughput_rps", "logical_throughput", "p99_ms", "error_ratio",
                             "server_rps", "primes_per_request"),
        "knee": _pick(r.knee, "power", "throughput_rps", "logical_throughput", "mean_ms", "p99_ms"),
        "servers_needed": r.servers_needed,
        "hits_from": r.hits_from,
        "servers_needed_basis": SERVERS_BASIS.get(r.hits_from),
        "workers": None if workers is None else asdict(workers),
        "stopped_at": None if stopped is None else stopped.load,
        "within_slo": _pick(r.within_slo, "logical_throughput", "p99_ms"),
        "slo_crossing": slo_crossing(r.steps, plan.slo),
    }


def capacity_dict(result: CapacityResult) -> dict:
    """What capacity.json holds (strict JSON: NaN written as null)."""
    p = result.plan
    return jsonable({
        "tool": "hstu-replay", "version": hstu_replay.__version__, "created": result.created,
        "model": p.model,
        "slo": {"p99_ms": p.slo.p99_ms, "error_ratio": p.slo.error_ratio},
        "load": {"kind": p.load_kind.name, "unit": p.load_kind.unit, "steps": list(p.loads),
                 "rate_users": p.rate_users if p.load_kind.name == "rate" else None},
        "batch_size": p.batch_size, "step_seconds": p.step_seconds, "warmup_seconds": p.warmup_seconds,
        "step_timeout_s": p.step_timeout_s, "target_rps": p.target_rps, "worker_cpu_share": p.worker_cpu_share,
        "workload_args": list(p.workload_args), "locust_args": list(p.locust_args),
        "metrics_url": p.metrics_url, "cache_metrics_url": p.cache_metrics_url,
        "pools": [pools.as_dict() for pools in p.pools], "repository": p.repository, "serve_args": list(p.serve_args),
        "passed": not result.unsustainable, "unsustainable": result.unsustainable,
        "ratios": [_ratio(r, p, pools) for r, pools in zip(result.ratios, result.pools_of())],
    })
