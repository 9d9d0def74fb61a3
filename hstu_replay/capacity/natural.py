"""`hstu-replay capacity natural`: the smallest KV cache (and servers) that meets a latency SLO
when users come back as the log says they do.

The hit-ratio-vs-budget curve of the store's natural replay (computed, one pass) picks the
budgets worth measuring: where it reaches each of `--curve-ratios`. Each is then measured, in
ascending order: the built-in target is started with that `--cache-budget-tokens` and replayed
naturally at the traffic level (`--request-rate`); with n servers each gets 1/n of the users
(`--timeline-shard 0/n`) and 1/n of the traffic. The first budget at which some server count up
to `--max-servers` meets the SLO is the answer (latency is taken to fall as the cache grows).
Every figure in capacity_natural.json says whether it was computed (the curve) or measured
(a real run: the server's own hit counters and the run's latency).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from hstu_replay.capacity.driver import (LOCUST_BAD_START, fresh_dir, last_error, measurement_from_report, stop_step,
                                         wait_step)
from hstu_replay.capacity.search import Measurement, Slo, judge
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.interface import Limits
from hstu_replay.loadtest.command import headless_command
from hstu_replay.plan.over_limit import HistoryPolicy, accounts_line
from hstu_replay.process import ServerProcess, StartFailed

SERVER_STOP_GRACE_S = 60.0  # a step's processes get this long after SIGTERM before SIGKILL
SERVE_TIMEOUT_S = 180.0
RESULT_JSON = "capacity_natural.json"


@dataclass(frozen=True)
class NaturalPlan:
    store: str
    repository: str
    out_dir: Path
    slo: Slo
    request_rate: float  # the whole traffic, requests/s
    curve_ratios: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95)
    budgets: tuple[int, ...] = ()  # given: measured as they are, instead of picked from the curve
    max_servers: int = 1
    users: int = 4  # Locust users sending the replay
    batch_size: int = 1
    time_slice_ms: int = 0
    step_seconds: float = 20.0
    warmup_seconds: float = 5.0
    candidates: int = 16
    max_history: int = 256
    page_tokens: int = 32
    serve_args: tuple[str, ...] = ()  # e.g. --threads 1 --config small
    policy: HistoryPolicy = HistoryPolicy()  # --over-limit, --rebase-keep

    @property
    def limits(self) -> Limits:
        return Limits(max_history=self.max_history)


def curves(plan: NaturalPlan) -> dict[int, object]:
    """servers -> the curve of one server's share (shard 0 of n) of the store's natural replay."""
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.plan.cache_curve import cache_curve
    from hstu_replay.plan.timeline import build_trace, group_requests, shard_trace

    trace = build_trace(SequenceStore.open(plan.store), plan.candidates, plan.limits, plan.batch_size, plan.policy)
    out = {}
    for n in range(1, plan.max_servers + 1):
        share = shard_trace(trace, 0, n)
        out[n] = cache_curve(share.cache_keys, share.tokens,
                             group_requests(share, plan.time_slice_ms, plan.batch_size), plan.page_tokens)
    return out


def visit_kinds(plan: NaturalPlan) -> dict:
    """Every visit of the store's natural replay by kind under the plan's --over-limit: the whole
    log's, and one server's share (shard 0 of n) for each server count."""
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.plan.timeline import build_trace, shard_trace

    trace = build_trace(SequenceStore.open(plan.store), plan.candidates, plan.limits, plan.batch_size, plan.policy)
    return {"log": trace.accounts().to_dict(plan.policy),
            "servers": {n: shard_trace(trace, 0, n).accounts().to_dict(plan.policy)
                        for n in range(1, plan.max_servers + 1)}}


def pick_budgets(curve, ratios: tuple[float, ...]) -> list[int]:
    """The smallest budget reaching each ratio the curve reaches, ascending, each once."""
    picked = {curve.budget_for(min(r, curve.max_ratio)) for r in ratios}
    return sorted(b for b in picked if b is not None)


def window_ratio(plan: NaturalPlan, computed: dict, budget: int, servers: int, report_dir: str | None) -> float | None:
    """The curve's ratio over exactly the run's measured window: the replay is deterministic, so
    the hits of requests [warm-up, sent) are those of the first `sent` less the first `warm-up`."""
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.plan.cache_curve import cache_curve
    from hstu_replay.plan.timeline import build_trace, group_requests, shard_trace

    path = Path(report_dir or "") / "report.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    warm = int(report.get("warmup_requests") or 0)
    sent = warm + sum(int(b["requests"]) + int(b.get("errors") or 0) for b in report.get("bins") or [])
    share = shard_trace(build_trace(SequenceStore.open(plan.store), plan.candidates, plan.limits, plan.batch_size,
                                    plan.policy), 0, servers)
    bounds = group_requests(share, plan.time_slice_ms, plan.batch_size)
    if sent <= warm or sent >= len(bounds):
        return None

    def first(n: int) -> tuple[int, int]:
        end = int(bounds[n])
        curve = cache_curve(share.cache_keys[:end], share.tokens[:end], bounds[: n + 1], plan.page_tokens)
        return curve.hit_tokens(budget), curve.total_tokens

    (hits, tokens), (warm_hits, warm_tokens) = first(sent), first(warm)
    return (hits - warm_hits) / (tokens - warm_tokens)


def step_command(plan: NaturalPlan, grpc_url: str, budget: int, servers: int, report_dir: Path) -> list[str]:
    return headless_command(
        report_dir, "-u", str(plan.users), "-r", str(plan.users), "--triton-url", grpc_url, "--workload", "timeline",
        "--store", plan.store, "--timeline-shard", f"0/{servers}", "--batch-sizes", str(plan.batch_size),
        "--time-slice-ms", str(plan.time_slice_ms), "--arrival", "constant",
        "--request-rate", f"{plan.request_rate / servers:g}", "--stage-seconds", f"{plan.step_seconds:g}",
        "--warmup-seconds", f"{plan.warmup_seconds:g}", "--max-history", str(plan.max_history),
        "--candidates", str(plan.candidates), "--cache-budget-tokens", str(budget),
        "--cache-page-tokens", str(plan.page_tokens),
        "--over-limit", plan.policy.over_limit.value, "--rebase-keep", f"{plan.policy.rebase_keep:g}",
    )


def run_natural_step(plan: NaturalPlan, budget: int, servers: int) -> Measurement:
    """A fresh built-in target with `budget`, one natural replay of its share at its share of the rate."""
    step_dir = fresh_dir(plan.out_dir / "steps" / f"b{budget}_s{servers}")
    server = ServerProcess.serve(plan.repository, step_dir / "server.log", None, "--cache-budget-tokens", str(budget),
                                 "--page-tokens", str(plan.page_tokens), *plan.serve_args,
                                 ready_timeout_s=SERVE_TIMEOUT_S)
    try:
        server.start()
        try:
            server.wait_ready()
        except StartFailed as exc:
            raise ServerError(f"the target did not start with budget {budget}: {exc}") from None
        log = step_dir / "locust.log"
        with log.open("w") as out:
            proc = subprocess.Popen(step_command(plan, server.grpc_url, budget, servers, step_dir),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
            try:
                timed_out = wait_step(proc, plan.warmup_seconds + plan.step_seconds + 120.0, None)
            except BaseException:
                stop_step(proc, SERVER_STOP_GRACE_S)
                raise
    finally:
        server.stop(SERVER_STOP_GRACE_S)
    if proc.returncode == LOCUST_BAD_START and not timed_out:
        raise ServerError(f"step b{budget}_s{servers}: Locust stopped: {last_error(log)} (log: {log})")
    report = step_dir / "report.json"
    if not report.is_file():
        return Measurement(float(budget), problem=f"Locust exited {proc.returncode} without a report: {last_error(log)}",
                           report_dir=str(step_dir))
    measured = measurement_from_report(json.loads(report.read_text()), float(budget))
    return replace(measured, report_dir=str(step_dir), returncode=proc.returncode,
                   problem="timed out" if timed_out else measured.problem)


StepRunner = Callable[[NaturalPlan, int, int], Measurement]


def plan_capacity(plan: NaturalPlan, run: StepRunner = run_natural_step,
                  say: Callable[[str], None] = print) -> dict:
    """Measure budgets in ascending order until one meets the SLO; the result, labelled."""
    computed = curves(plan)
    kinds = visit_kinds(plan)
    say(accounts_line(kinds["log"]))
    budgets = list(plan.budgets) or pick_budgets(computed[1], plan.curve_ratios)
    if not budgets:
        raise ConfigError(f"--store {plan.store}: its curve reaches none of the ratios {plan.curve_ratios}")
    steps, answer = [], None
    for budget in sorted(budgets):
        for servers in range(1, plan.max_servers + 1):
            predicted = computed[servers].ratio(budget)
            step = judge(run(plan, budget, servers), plan.slo)
            m = step.measurement
            steps.append({
                "budget_tokens": budget, "servers": servers, "rate_per_server": plan.request_rate / servers,
                "computed": {"hit_ratio": predicted,
                             "window_hit_ratio": window_ratio(plan, computed, budget, servers, m.report_dir)},
                "measured": {"hit_ratio": m.achieved_ratio, "hit_source": m.hit_source, "p99_ms": m.p99_ms,
                             "p50_ms": m.p50_ms, "latency_basis": m.latency_basis, "error_ratio": m.error_ratio,
                             "throughput_rps": m.throughput_rps, "requests": m.requests},
                "passed": step.passed, "breaches": list(step.breaches), "report_dir": m.report_dir,
            })
            say(f"budget {budget:,} tokens x {servers} server(s) at {plan.request_rate / servers:g} req/s each: "
                f"hit ratio {_fmt(m.achieved_ratio)} measured ({m.hit_source}), "
                f"{_fmt(steps[-1]['computed']['window_hit_ratio'])} computed for its window ({predicted:.4f} for the whole log), "
                f"p99 {_fmt(m.p99_ms, '.1f')} ms: " + ("meets the SLO" if step.passed else "; ".join(step.breaches)))
            if step.passed:
                answer = {"budget_tokens": budget, "servers": servers, "total_tokens": budget * servers}
                break
        if answer:
            break
    return {
        "slo": asdict(plan.slo), "request_rate": plan.request_rate, "store": plan.store,
        "curve": {"computed": True, "budgets_picked_from_ratios": None if plan.budgets else list(plan.curve_ratios),
                  "servers": {n: {"all_fit_tokens": c.all_fit_tokens, "max_ratio": c.max_ratio,
                                  "requests": c.requests} for n, c in computed.items()},
                  "visit_kinds": kinds},
        "steps": steps, "answer": answer,
        "labels": {"computed": "from the one-pass curve of the store's natural replay, no server involved",
                   "measured": "from a real natural-replay run: the server's own hit counters, the run's latency"},
    }


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def write_result(result: dict, out_dir: Path) -> Path:
    path = out_dir / RESULT_JSON
    path.write_text(json.dumps(result, indent=2))
    return path
