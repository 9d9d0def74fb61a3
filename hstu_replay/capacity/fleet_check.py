"""`capacity run --verify-fleet`: the plan checked by running the fleet it names.

After the search, every hit ratio whose plan names a fleet (`servers_needed` for --target-rps)
gets one more step: that many reference servers of --repository started together on loopback
(`fleet.local.LocalFleet`), each with the cache the plan measured (its pools' GPU budget, else
the server's default), driven by one Locust run at the target rate (open loop, Poisson,
--target-rps / batch size requests/s) with `--routing key-hash` over them. The step is judged
against the SLO like every other; its report's fleet section gives each server's hit ratio and
share. A plan whose fleet misses the SLO it promised is flagged (and `capacity run` exits 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hstu_replay.capacity.driver import LOAD_KINDS, CapacityPlan, CapacityResult, run_step
from hstu_replay.capacity.search import Measurement, RatioResult, StepResult, judge
from hstu_replay.errors import ConfigError

FLEET_DIR = "fleet"
ADDRESS_FLAGS = ("--triton-url", "--host")


@dataclass(frozen=True)
class FleetCheck:
    """One hit ratio's plan, run."""

    hit_ratio: float
    servers: int
    request_rate: float  # requests/s offered to the whole fleet
    planned: StepResult  # the sustainable step the plan rests on (one server)
    step: StepResult  # the fleet's step at the target rate
    fleet: dict | None  # the step report's fleet section (None for a fleet of one)

    @property
    def meets_slo(self) -> bool:
        return self.step.passed


def fleet_plan(plan: CapacityPlan, addresses: list[str]) -> CapacityPlan:
    """The plan's step options aimed at `addresses` with key-hash routing, one step under fleet/."""
    kept, args = [], list(plan.workload_args)
    while args:
        flag = args.pop(0)
        if flag in ADDRESS_FLAGS:
            args.pop(0)
            continue
        kept.append(flag)
    return replace(plan, load_kind=LOAD_KINDS["rate"], out_dir=plan.out_dir / FLEET_DIR, pools=(),
                   metrics_url=None, cache_metrics_url=None,
                   workload_args=(*kept, "--host", ",".join(addresses), "--routing", "key-hash"))


def check_one(plan: CapacityPlan, ratio: RatioResult, budget: int | None, run: Callable = run_step) -> FleetCheck:
    from hstu_replay.fleet.local import LocalFleet

    n = ratio.servers_needed
    rate = plan.target_rps / plan.batch_size
    folder = plan.out_dir / FLEET_DIR / f"h{ratio.hit_ratio:.2f}_x{n}"
    with LocalFleet(plan.repository, n, folder, budget, plan.serve_args) as fleet:
        grpc = [b.grpc for b in fleet.backends]
        measured: Measurement = run(fleet_plan(plan, grpc), ratio.hit_ratio, rate)
    step = judge(measured, plan.slo)
    return FleetCheck(ratio.hit_ratio, n, rate, ratio.sustainable, step, _fleet_section(measured))


def _fleet_section(m: Measurement) -> dict | None:
    import json

    report = Path(m.report_dir or "") / "report.json"
    if not report.is_file():
        return None
    return json.loads(report.read_text()).get("fleet")


def check_plan(result: CapacityResult, on_check: Callable[[FleetCheck], None] | None = None) -> list[FleetCheck]:
    """Each hit ratio with a fleet size, its fleet started and driven at the target rate."""
    plan = result.plan
    checks = []
    for ratio, pools in zip(result.ratios, result.pools_of()):
        if ratio.servers_needed is None or ratio.sustainable is None:
            continue
        check = check_one(plan, ratio, None if pools is None else pools.gpu_tokens)
        checks.append(check)
        if on_check is not None:
            on_check(check)
    return checks


def check_options(plan: CapacityPlan) -> None:
    """--verify-fleet needs the target rate and the reference target to start: one line if not."""
    if plan.target_rps is None:
        raise ConfigError("--verify-fleet runs the fleet the plan names for --target-rps: give --target-rps")
    if plan.repository is None or not Path(plan.repository).is_dir():
        raise ConfigError("--verify-fleet starts the reference servers the plan names: give --repository "
                          "(the built-in target's model repository)")


def check_dict(check: FleetCheck) -> dict:
    m = check.step.measurement
    planned = check.planned.measurement
    stage = (check.fleet or {}).get("stages", [{}])[0] if check.fleet else {}
    return {
        "hit_ratio": check.hit_ratio, "servers": check.servers, "request_rate": check.request_rate,
        "meets_slo": check.meets_slo, "breaches": list(check.step.breaches),
        "planned_p99_ms": planned.p99_ms, "measured_p99_ms": m.p99_ms,
        "planned_logical_rps_per_server": planned.logical_throughput,
        "measured_logical_rps": m.logical_throughput, "achieved_ratio": m.achieved_ratio,
        "imbalance": stage.get("imbalance"),
        "per_server": [{k: r.get(k) for k in ("server", "requests", "share", "observed_ratio", "p99_ms")}
                       for r in stage.get("servers", [])],
        "report_dir": m.report_dir,
    }


def check_line(check: FleetCheck) -> str:
    d = check_dict(check)
    ratios = ", ".join(f"{r['observed_ratio']:.3f}" if r["observed_ratio"] is not None else "-"
                       for r in d["per_server"])
    verdict = "meets the SLO" if check.meets_slo else f"MISSES the SLO ({'; '.join(check.step.breaches)})"
    measured = "-" if d["measured_p99_ms"] is None else f"{d['measured_p99_ms']:.1f}"
    planned = "-" if d["planned_p99_ms"] is None else f"{d['planned_p99_ms']:.1f}"
    return (f"hstu-replay: capacity: fleet of {check.servers} at hit ratio {check.hit_ratio:g}, "
            f"{check.request_rate:g} req/s: p99 {measured} ms (planned {planned}), hit ratio per server {ratios}: "
            f"{verdict}")
