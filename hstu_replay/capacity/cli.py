"""`hstu-replay capacity run`: step the load per hit ratio until the SLO breaks; size the fleet.

Every option is read as text and checked here, so a bad one is a single ConfigError line (exit 2)
rather than argparse's usage block. Exit 0: every hit ratio has a sustainable step; 3: some has none.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hstu_replay.arguments import number, numbers
from hstu_replay.errors import ConfigError

NO_SUSTAINABLE_STEP_EXIT = 3
STEP_TIMEOUT_SLACK_S = 120.0  # Locust start, interface detection, priming and shutdown on top of the stage

#: workload options handed to every step as given: capacity option -> Locust option
PASS_THROUGH = ("--workload", "--store", "--dump-dir", "--triton-url", "--triton-protocol", "--max-history",
                "--candidates")
#: Locust options each step sets itself; --locust-args may not set them
CONTROLLED = frozenset({
    "-f", "--locustfile", "--headless", "-u", "--users", "-r", "--spawn-rate", "-t", "--run-time",
    "--hit-ratios", "--batch-sizes", "--stage-seconds", "--warmup-seconds", "--arrival", "--request-rate",
    "--report-dir", "--triton-model", *PASS_THROUGH,
})


def add_commands(groups) -> None:
    capacity = groups.add_parser("capacity", help="capacity planning: load steps until an SLO breaks")
    actions = capacity.add_subparsers(dest="capacity_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="step the load per hit ratio until the SLO breaks; size the fleet",
                             description=__doc__.splitlines()[0])
    opt = run.add_argument
    opt("--hit-ratios", default="0,0.5,1.0",
        help="target KV-cache hit ratios, searched one by one (default %(default)s)")
    opt("--users-steps", metavar="N,N,...", help="closed loop: concurrent users per step, ascending")
    opt("--rate-steps", metavar="R,R,...", help="open loop (Poisson): offered requests/s per step, ascending")
    opt("--rate-users", default="8", help="users sending the open-loop rate steps (default %(default)s)")
    opt("--slo-p99-ms", help="SLO: p99 latency in ms (open loop: from the intended send time); required")
    opt("--slo-error-ratio", default="0.01", help="SLO: largest failure ratio (default %(default)s)")
    opt("--target-rps", help="logical requests/s the fleet must serve: servers (and Locust workers) needed "
                             "per hit ratio")
    opt("--worker-cpu-share", default="0.7",
        help="share of one core a Locust worker is planned to use, for the workers needed (default %(default)s)")
    opt("--batch-size", default="1", help="users per request, 1..8 (default %(default)s)")
    opt("--step-seconds", default="10", help="measured seconds per step (default %(default)s)")
    opt("--warmup-seconds", default="2", help="warm-up seconds before each step's window (default %(default)s)")
    opt("--step-timeout", help=f"seconds before a step is stopped (default: warm-up + step + {STEP_TIMEOUT_SLACK_S:g})")
    opt("--workload", default="sessions", help="sessions (--store) or dumps (--dump-dir) (default %(default)s)")
    opt("--store", help="prepared KuaiRand store (sessions)")
    opt("--dump-dir", help="NVIDIA-format dump directory (dumps)")
    opt("--triton-url", help="Triton host:port (Locust's default 127.0.0.1:8001)")
    opt("--triton-protocol", help="grpc or http")
    opt("--triton-model", default="hstu_gr_ranking_kvcache", help="model (default %(default)s)")
    opt("--max-history", help="longest history sent, in items")
    opt("--candidates", help="candidates ranked per user (sessions)")
    opt("--locust-args", default="",
        help='more Locust arguments for every step, e.g. --locust-args="--master --expect-workers 2"')
    opt("--metrics-url", help="Triton's Prometheus endpoint, e.g. 127.0.0.1:8002: per-step queue/compute deltas")
    opt("--cache-metrics-url", help="our target's KV-cache counters, e.g. 127.0.0.1:8003")
    opt("--out", default="runs/capacity", help="output directory (default %(default)s)")
    run.set_defaults(func=_run)

    natural = actions.add_parser("natural", help="the smallest KV cache (and servers) meeting an SLO under "
                                                 "natural replay: budgets picked from the curve, each measured")
    opt = natural.add_argument
    opt("--store", help="prepared KuaiRand store to replay naturally; required")
    opt("--repository", help="model repository of the built-in target, started once per budget; required")
    opt("--slo-p99-ms", help="SLO: p99 latency in ms, from the intended send time; required")
    opt("--slo-error-ratio", default="0.01", help="SLO: largest failure ratio (default %(default)s)")
    opt("--request-rate", help="traffic: requests/s over all servers; required")
    opt("--curve-ratios", default="0.5,0.8,0.9,0.95",
        help="measure the budgets where the curve reaches these hit ratios (default %(default)s)")
    opt("--budgets", help="measure these budgets (tokens) instead of picking them from the curve")
    opt("--max-servers", default="1", help="split users and traffic over up to this many servers (default %(default)s)")
    opt("--users", default="4", help="Locust users sending the replay (default %(default)s)")
    opt("--batch-size", default="1", help="most visits per request, 1..8 (default %(default)s)")
    opt("--time-slice-ms", default="0", help="visits of one slice of log time share a request (default %(default)s)")
    opt("--step-seconds", default="20", help="measured seconds per budget (default %(default)s)")
    opt("--warmup-seconds", default="5", help="warm-up seconds before each window (default %(default)s)")
    opt("--candidates", default="16", help="candidates per visit, at most (default %(default)s)")
    opt("--max-history", default="256", help="longest history in items (default %(default)s)")
    opt("--page-tokens", default="32", help="KV-cache page size in tokens (default %(default)s)")
    opt("--serve-args", default="", help='more `server serve` arguments, e.g. --serve-args="--threads 1"')
    opt("--out", default="runs/capacity-natural", help="output directory (default %(default)s)")
    natural.set_defaults(func=_natural)


# -- options -> plan --------------------------------------------------------------------------

def _locust_args(text: str) -> tuple[str, ...]:
    try:
        args = tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigError(f"--locust-args {text!r}: {exc}") from None
    for arg in args:
        if arg.split("=", 1)[0] in CONTROLLED:
            raise ConfigError(f"--locust-args: {arg.split('=', 1)[0]} is set by capacity run itself"
                              " (use its own option)")
    return args


def _workload_args(args: argparse.Namespace) -> tuple[str, ...]:
    if args.workload not in ("sessions", "dumps"):
        raise ConfigError(f"--workload {args.workload!r}: use sessions or dumps")
    needed = "--store" if args.workload == "sessions" else "--dump-dir"
    if not getattr(args, needed[2:].replace("-", "_")):
        raise ConfigError(f"--workload {args.workload} needs {needed}")
    out: list[str] = []
    for flag in PASS_THROUGH:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            out += [flag, str(value)]
    return tuple(out)


def plan_from_args(args: argparse.Namespace):
    """The validated plan; ConfigError (one line) on the first bad option."""
    from hstu_replay.capacity.driver import LOAD_KINDS, CapacityPlan
    from hstu_replay.capacity.metrics import metrics_url
    from hstu_replay.capacity.search import Slo

    ratios = numbers("--hit-ratios", args.hit_ratios, 0.0)
    if any(r > 1.0 for r in ratios):
        raise ConfigError(f"--hit-ratios {args.hit_ratios!r}: every ratio must lie in 0..1")
    given = [k for k in LOAD_KINDS.values() if getattr(args, k.flag[2:].replace("-", "_")) is not None]
    if len(given) != 1:
        raise ConfigError(f"give exactly one of {' or '.join(k.flag for k in LOAD_KINDS.values())}")
    kind = given[0]
    loads = numbers(kind.flag, getattr(args, kind.flag[2:].replace("-", "_")), 0.0, above=True,
                     integral=kind.integral)
    if any(b <= a for a, b in zip(loads, loads[1:])):
        raise ConfigError(f"{kind.flag} {','.join(f'{x:g}' for x in loads)}: steps must ascend")
    if args.slo_p99_ms is None:
        raise ConfigError("--slo-p99-ms is required (the p99 latency objective in ms)")
    slo = Slo(number("--slo-p99-ms", args.slo_p99_ms, 0.0, above=True),
              number("--slo-error-ratio", args.slo_error_ratio, 0.0))
    if slo.error_ratio > 1.0:
        raise ConfigError(f"--slo-error-ratio {args.slo_error_ratio!r}: use 0..1")
    batch = number("--batch-size", args.batch_size, 1, integral=True)
    if batch > 8:
        raise ConfigError(f"--batch-size {args.batch_size!r}: use 1..8")
    share = number("--worker-cpu-share", args.worker_cpu_share, 0.0, above=True)
    if share > 1.0:
        raise ConfigError(f"--worker-cpu-share {args.worker_cpu_share!r}: use a share of one core, 0..1")
    step_s = number("--step-seconds", args.step_seconds, 0.0, above=True)
    warmup_s = number("--warmup-seconds", args.warmup_seconds, 0.0)
    timeout_s = (warmup_s + step_s + STEP_TIMEOUT_SLACK_S if args.step_timeout is None
                 else number("--step-timeout", args.step_timeout, 0.0, above=True))
    if timeout_s <= warmup_s + step_s:
        raise ConfigError(f"--step-timeout {timeout_s:g}: must exceed warm-up + step ({warmup_s + step_s:g} s)")
    return CapacityPlan(
        hit_ratios=ratios, load_kind=kind, loads=loads, slo=slo, out_dir=Path(args.out), batch_size=batch,
        step_seconds=step_s, warmup_seconds=warmup_s,
        rate_users=number("--rate-users", args.rate_users, 1, integral=True),
        target_rps=None if args.target_rps is None else number("--target-rps", args.target_rps, 0.0, above=True),
        worker_cpu_share=share,
        model=args.triton_model, workload_args=_workload_args(args), locust_args=_locust_args(args.locust_args),
        metrics_url=metrics_url(args.metrics_url) if args.metrics_url else None,
        cache_metrics_url=metrics_url(args.cache_metrics_url) if args.cache_metrics_url else None,
        step_timeout_s=timeout_s,
    )


# -- the command ------------------------------------------------------------------------------

def _failure_line(data: dict) -> str:
    """One line naming every hit ratio without a sustainable step and why its first step failed."""
    parts = []
    for r in data["ratios"]:
        if r["sustainable"] is None:
            first = r["steps"][0] if r["steps"] else None
            why = f" (load {first['load']:g}: {'; '.join(first['breaches'])})" if first else ""
            parts.append(f"{r['hit_ratio']:.2f}{why}")
    return "no step met the SLO at hit ratio " + ", ".join(parts)


def _run(args: argparse.Namespace) -> int:
    from hstu_replay.capacity.driver import check_endpoints, run_capacity
    from hstu_replay.loadtest.command import LOCUSTFILE
    from hstu_replay.report.capacity import capacity_dict, format_summary, step_line, write_capacity

    plan = plan_from_args(args)
    if not LOCUSTFILE.is_file():
        raise ConfigError(f"locustfile {LOCUSTFILE} not found (install hstu-replay from its repository)")
    check_endpoints(plan)
    print(f"hstu-replay: capacity: {len(plan.hit_ratios)} hit ratio(s), up to {len(plan.loads)} step(s) of "
          f"{plan.warmup_seconds:g}+{plan.step_seconds:g} s each ({plan.load_kind.unit}), "
          f"SLO p99 <= {plan.slo.p99_ms:g} ms, error ratio <= {plan.slo.error_ratio:g}", flush=True)
    result = run_capacity(plan, on_step=lambda ratio, step: print(step_line(ratio, step, plan.out_dir), flush=True))
    written = write_capacity(result)
    data = capacity_dict(result)
    print(format_summary(data), flush=True)
    print(f"hstu-replay: capacity written to {plan.out_dir.resolve()} (open {written['html'].resolve()})", flush=True)
    if result.unsustainable:
        print(f"hstu-replay: FAIL: {_failure_line(data)}", file=sys.stderr, flush=True)
        return NO_SUSTAINABLE_STEP_EXIT
    return 0


def _natural(args: argparse.Namespace) -> int:
    from hstu_replay.capacity.natural import NaturalPlan, plan_capacity, write_result
    from hstu_replay.capacity.search import Slo

    for flag in ("store", "repository", "slo_p99_ms", "request_rate"):
        if getattr(args, flag) is None:
            raise ConfigError(f"--{flag.replace('_', '-')} is required")
    if not Path(args.repository).is_dir():
        raise ConfigError(f"--repository {args.repository}: no such folder")
    try:
        serve_args = tuple(shlex.split(args.serve_args))
    except ValueError as exc:
        raise ConfigError(f"--serve-args {args.serve_args!r}: {exc}") from None
    batch = number("--batch-size", args.batch_size, 1, integral=True)
    if batch > 8:
        raise ConfigError(f"--batch-size {args.batch_size}: use 1..8")
    plan = NaturalPlan(
        store=args.store, repository=args.repository, out_dir=Path(args.out),
        slo=Slo(number("--slo-p99-ms", args.slo_p99_ms, 0, above=True),
                number("--slo-error-ratio", args.slo_error_ratio, 0)),
        request_rate=number("--request-rate", args.request_rate, 0, above=True),
        curve_ratios=numbers("--curve-ratios", args.curve_ratios, 0),
        budgets=tuple(int(b) for b in numbers("--budgets", args.budgets, 0, integral=True)) if args.budgets else (),
        max_servers=number("--max-servers", args.max_servers, 1, integral=True),
        users=number("--users", args.users, 1, integral=True), batch_size=batch,
        time_slice_ms=number("--time-slice-ms", args.time_slice_ms, 0, integral=True),
        step_seconds=number("--step-seconds", args.step_seconds, 0, above=True),
        warmup_seconds=number("--warmup-seconds", args.warmup_seconds, 0),
        candidates=number("--candidates", args.candidates, 1, integral=True),
        max_history=number("--max-history", args.max_history, 1, integral=True),
        page_tokens=number("--page-tokens", args.page_tokens, 1, integral=True), serve_args=serve_args)
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.errors import HstuReplayError

    try:
        SequenceStore.open(plan.store)
    except HstuReplayError as exc:
        raise ConfigError(f"--store {plan.store}: {str(exc).removeprefix(f'{plan.store}: ')}") from None
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    result = plan_capacity(plan)
    path = write_result(result, plan.out_dir)
    answer = result["answer"]
    if answer is None:
        print(f"no budget measured meets p99 <= {plan.slo.p99_ms:g} ms at {plan.request_rate:g} req/s "
              f"with up to {plan.max_servers} server(s) (see {path})", file=sys.stderr)
        return NO_SUSTAINABLE_STEP_EXIT
    print(f"smallest cache meeting p99 <= {plan.slo.p99_ms:g} ms at {plan.request_rate:g} req/s: "
          f"{answer['budget_tokens']:,} tokens per server x {answer['servers']} server(s) (measured; "
          f"budgets picked from the computed curve); written to {path}")
    return 0
