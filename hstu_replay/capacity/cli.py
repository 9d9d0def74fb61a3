"""`hstu-replay capacity run`: step the load per hit ratio until the SLO breaks; size the fleet.

Every option is read as text and checked here, so a bad one is a single ConfigError line (exit 2)
rather than argparse's usage block. Exit 0: every hit ratio has a sustainable step; 3: some has none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hstu_replay.arguments import (
    BATCH_SIZE, BUDGETS, CANDIDATES, DUMP_DIR, HIT_RATIOS, MAX_HISTORY, OVER_LIMIT, PAGE_TOKENS, REBASE_KEEP,
    REPOSITORY, REQUEST_RATE, SERVE_ARGS, SLO_ERROR_RATIO, SLO_P99_MS, SMALL_MAX_HISTORY, STORE, TIME_SLICE_MS,
    TRITON_MODEL, TRITON_PROTOCOL, TRITON_URL, VISITS_PER_REQUEST, WARMUP_SECONDS, WORKLOAD, Option, batch_number,
    hit_ratio_numbers, number, numbers, split_args,
)
from hstu_replay.errors import ConfigError
from hstu_replay.interface import DEFAULT_ADDRESS
from hstu_replay.plan.reuse import PartialHits
from hstu_replay.plan.workloads import WORKLOADS, one_of
from hstu_replay.process import long_running

NO_SUSTAINABLE_STEP_EXIT = 3
STEP_TIMEOUT_SLACK_S = 120.0  # Locust start, interface detection, priming and shutdown on top of the stage
STEP_SECONDS = Option("--step-seconds", "measured seconds per step", 10)
HOST_BUDGETS = Option("--host-budgets", "host-tier budgets (tokens), comma-separated (0: none; NVIDIA's "
                                        "cpu_cache_gb is 1 GB)", "")
OFFLOAD_MODE = Option("--offload-mode", "how the host tier is filled: native (the reference target's default) "
                                        "or flexkv", "native")

#: workload options handed to every step as given: capacity option -> Locust option
PASS_THROUGH = ("--workload", "--store", "--dump-dir", "--triton-url", "--triton-protocol", "--max-history",
                "--candidates")
#: Locust options each step sets itself; --locust-args may not set them
CONTROLLED = frozenset({
    "-f", "--locustfile", "--headless", "-u", "--users", "-r", "--spawn-rate", "-t", "--run-time",
    "--hit-ratios", "--batch-sizes", "--stage-seconds", "--warmup-seconds", "--arrival", "--request-rate",
    "--report-dir", "--triton-model", "--partial-hits", *PASS_THROUGH,
})
#: how every step of a workload that can mix full hits and misses reaches a partial hit ratio: without a
#: priming request per measured one, which a production server would not compute (plan.reuse.PartialHits)
PARTIAL_HITS = PartialHits.REUSE


def add_commands(groups) -> None:
    capacity = groups.add_parser("capacity", help="capacity planning: load steps until an SLO breaks",
                                 epilog="example: hstu-replay capacity run --workload dumps --dump-dir runs/dumps "
                                        "--users-steps 1,2,4 --slo-p99-ms 250")
    actions = capacity.add_subparsers(dest="capacity_command", required=True, metavar="ACTION")
    run = actions.add_parser("run", help="step the load per hit ratio until the SLO breaks; size the fleet",
                             description=__doc__.splitlines()[0],
                             epilog="example: hstu-replay capacity run --workload dumps --dump-dir runs/dumps "
                                    "--max-history 256 --users-steps 1,2,4,8 --slo-p99-ms 250 --out runs/capacity")
    HIT_RATIOS.add_to(run, help="target KV-cache hit ratios, searched one by one", text=True)
    Option("--users-steps", "closed loop: concurrent users per step, ascending", metavar="N,N,...").add_to(run)
    Option("--rate-steps", "open loop (Poisson): offered requests/s per step, ascending",
           metavar="R,R,...").add_to(run)
    Option("--rate-users", "users sending the open-loop rate steps", 8).add_to(run, text=True)
    SLO_P99_MS.add_to(run, help="SLO: p99 latency in ms (open loop: from the intended send time); required", text=True)
    SLO_ERROR_RATIO.add_to(run, text=True)
    Option("--target-rps", "logical requests/s the fleet must serve: servers (and Locust workers) needed "
                           "per hit ratio").add_to(run)
    Option("--worker-cpu-share", "share of one core a Locust worker is planned to use, for the workers needed",
           0.7).add_to(run, text=True)
    BATCH_SIZE.add_to(run, text=True)
    STEP_SECONDS.add_to(run, text=True)
    WARMUP_SECONDS.add_to(run, text=True)
    Option("--step-timeout", f"seconds before a step is stopped (default: warm-up + step + "
                             f"{STEP_TIMEOUT_SLACK_S:g})").add_to(run)
    # workload options: none is set here unless given, so each step gets the load test's own default
    WORKLOAD.add_to(run, text=True)
    STORE.add_to(run, help="prepared KuaiRand store (sessions)", metavar=None)
    DUMP_DIR.add_to(run, help="NVIDIA-format dump directory (dumps)", metavar=None)
    TRITON_URL.add_to(run, default=None, help=f"Triton host:port (Locust's default {DEFAULT_ADDRESS})")
    TRITON_PROTOCOL.add_to(run, default=None)
    TRITON_MODEL.add_to(run, text=True)
    MAX_HISTORY.add_to(run, default=None, help="longest history sent, in items", text=True)
    CANDIDATES.add_to(run, default=None, help="candidates ranked per user (sessions)", text=True)
    Option("--locust-args", 'more Locust arguments for every step, e.g. --locust-args="--master --expect-workers 2"',
           "").add_to(run)
    Option("--metrics-url", "Triton's Prometheus endpoint, e.g. 127.0.0.1:8002: per-step queue/compute deltas"
           ).add_to(run)
    Option("--cache-metrics-url", "our target's KV-cache counters, e.g. 127.0.0.1:8003").add_to(run)
    # per tier budget: the built-in target served with each (GPU, host) pair in turn
    BUDGETS.add_to(run, help="GPU pool budgets (tokens): search against the built-in target served with each, "
                             "behind each --host-budgets (needs --repository)", metavar=None)
    HOST_BUDGETS.add_to(run, help="host-tier budgets (tokens) behind each --budgets (0: none)", text=True)
    REPOSITORY.add_to(run, default=None, help="model repository of the built-in target, served once per pair of "
                                              "--budgets and --host-budgets")
    OFFLOAD_MODE.add_to(run)
    SERVE_ARGS.add_to(run)
    Option("--verify-fleet", "after the search, start the fleet each plan names (reference servers of "
           "--repository on loopback) and drive it at --target-rps: measured vs planned", type=bool).add_to(run)
    Option("--out", "output directory", "runs/capacity").add_to(run)
    run.set_defaults(func=_run)

    natural = actions.add_parser("natural", help="the smallest KV cache (and servers) meeting an SLO under "
                                                 "natural replay: budgets picked from the curve, each measured",
                                 epilog="example: hstu-replay capacity natural --store runs/store --repository "
                                        "runs/model_repository --slo-p99-ms 50 --request-rate 30 --max-servers 2")
    STORE.add_to(natural, help="prepared KuaiRand store to replay naturally; required", metavar=None)
    REPOSITORY.add_to(natural, default=None,
                      help="model repository of the built-in target, started once per budget; required")
    SLO_P99_MS.add_to(natural, help="SLO: p99 latency in ms, from the intended send time; required", text=True)
    SLO_ERROR_RATIO.add_to(natural, text=True)
    REQUEST_RATE.add_to(natural, help="traffic: requests/s over all servers; required", text=True)
    Option("--curve-ratios", "measure the budgets where the curve reaches these hit ratios",
           "0.5,0.8,0.9,0.95").add_to(natural)
    BUDGETS.add_to(natural, help="measure these budgets (tokens) instead of picking them from the curve",
                   metavar=None)
    Option("--max-servers", "split users and traffic over up to this many servers", 1).add_to(natural, text=True)
    Option("--shards-measured", "with n servers, measure this many of the n shards, each in turn against its own "
           "target (0: all; the curve's spread over all n is computed either way)", 0).add_to(natural, text=True)
    Option("--users", "Locust users sending the replay", 4).add_to(natural, text=True)
    VISITS_PER_REQUEST.add_to(natural, text=True)
    TIME_SLICE_MS.add_to(natural, help="visits of one slice of log time share a request", text=True)
    # a cache is measured warm: longer windows than a load step's
    STEP_SECONDS.add_to(natural, default=20, help="measured seconds per budget", text=True)
    WARMUP_SECONDS.add_to(natural, default=5, help="warm-up seconds before each window", text=True)
    CANDIDATES.add_to(natural, help="candidates per visit, at most", text=True)
    SMALL_MAX_HISTORY.add_to(natural, text=True)  # the built-in target serves the small model
    OVER_LIMIT.add_to(natural)
    REBASE_KEEP.add_to(natural, text=True)
    PAGE_TOKENS.add_to(natural, text=True)
    HOST_BUDGETS.add_to(natural, help="host-tier budgets (tokens): the GPU search runs behind each in turn (0: none; "
                                      "NVIDIA's cpu_cache_gb is 1 GB); the computed grid: plan cache-curve "
                                      "--host-budgets", text=True)
    OFFLOAD_MODE.add_to(natural)
    SERVE_ARGS.add_to(natural)
    Option("--out", "output directory", "runs/capacity-natural").add_to(natural)
    natural.set_defaults(func=_natural)


# -- options -> plan --------------------------------------------------------------------------

def _locust_args(text: str) -> tuple[str, ...]:
    args = split_args("--locust-args", text)
    for arg in args:
        if arg.split("=", 1)[0] in CONTROLLED:
            raise ConfigError(f"--locust-args: {arg.split('=', 1)[0]} is set by capacity run itself"
                              " (use its own option)")
    return args


def _workload_args(args: argparse.Namespace) -> tuple[str, ...]:
    stepped = {name: kind for name, kind in WORKLOADS.items() if not kind.natural}  # natural: `capacity natural`
    if args.workload not in stepped:
        raise ConfigError(f"--workload {args.workload!r}: use {one_of(stepped)}")
    kind = stepped[args.workload]
    if not getattr(args, kind.data_option):
        raise ConfigError(f"--workload {args.workload} needs {kind.data_flag}")
    out: list[str] = []
    for flag in PASS_THROUGH:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            out += [flag, str(value)]
    if kind.mixes_hits:
        out += ["--partial-hits", PARTIAL_HITS.value]
    return tuple(out)


def _pools(args: argparse.Namespace) -> tuple:
    """(GPU, host) pairs of --budgets and --host-budgets, checked; () when neither is given."""
    from hstu_replay.capacity.pools import pool_pairs

    if not args.budgets and not args.host_budgets:
        for flag in ("repository", "serve_args"):
            if getattr(args, flag) and not args.verify_fleet:
                raise ConfigError(f"--{flag.replace('_', '-')} serves the built-in target per pair of pools: "
                                  "give --budgets too (or leave it out and give --triton-url)")
        return ()
    if not args.budgets:
        raise ConfigError("--host-budgets needs --budgets (the GPU pools to serve behind each host budget)")
    if args.repository is None:
        raise ConfigError("--budgets needs --repository (the built-in target is served with each pair of pools)")
    if not Path(args.repository).is_dir():
        raise ConfigError(f"--repository {args.repository}: no such folder")
    for flag in ("triton_url", "metrics_url", "cache_metrics_url"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')}: leave it out with --budgets (each pair of pools is "
                              "served on ports of its own)")
    gpu = tuple(sorted({int(b) for b in numbers("--budgets", args.budgets, 0, above=True, integral=True)}))
    host = (tuple(sorted({int(b) for b in numbers("--host-budgets", args.host_budgets, 0, integral=True)}))
            if args.host_budgets else (0,))
    return pool_pairs(gpu, host, _offload_mode(args.offload_mode))


def plan_from_args(args: argparse.Namespace):
    """The validated plan; ConfigError (one line) on the first bad option."""
    from hstu_replay.capacity.driver import LOAD_KINDS, CapacityPlan
    from hstu_replay.metrics.pages import metrics_url
    from hstu_replay.capacity.search import Slo

    ratios = hit_ratio_numbers("--hit-ratios", args.hit_ratios)
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
    batch = batch_number("--batch-size", args.batch_size)
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
        pools=_pools(args), repository=args.repository, serve_args=split_args("--serve-args", args.serve_args),
    )


# -- the command ------------------------------------------------------------------------------

def _failure_line(data: dict) -> str:
    """One line naming every hit ratio without a sustainable step and why its first step failed."""
    from hstu_replay.capacity.pools import TargetPools

    parts = []
    for r in data["ratios"]:
        if r["sustainable"] is None:
            first = r["steps"][0] if r["steps"] else None
            why = f" (load {first['load']:g}: {'; '.join(first['breaches'])})" if first else ""
            pools = f" with pools {TargetPools(**r['pools']).name}" if r.get("pools") else ""
            parts.append(f"{r['hit_ratio']:.2f}{pools}{why}")
    return "no step met the SLO at hit ratio " + ", ".join(parts)


@long_running
def _run(args: argparse.Namespace) -> int:
    from hstu_replay.capacity.driver import check_endpoints, run_capacity
    from hstu_replay.capacity.files import write_capacity
    from hstu_replay.capacity.result import capacity_dict
    from hstu_replay.capacity.tables import format_summary, step_header_line, step_line

    plan = plan_from_args(args)
    if args.verify_fleet:
        from hstu_replay.capacity.fleet_check import check_options

        check_options(plan)
    check_endpoints(plan)
    print(f"hstu-replay: capacity: {len(plan.hit_ratios)} hit ratio(s), up to {len(plan.loads)} step(s) of "
          f"{plan.warmup_seconds:g}+{plan.step_seconds:g} s each ({plan.load_kind.unit}), "
          f"SLO p99 <= {plan.slo.p99_ms:g} ms, error ratio <= {plan.slo.error_ratio:g}", flush=True)
    column = plan.load_kind.column
    if not plan.pools:
        print(step_header_line(column), flush=True)

    def on_pools(pools) -> None:
        print(f"hstu-replay: capacity: serving pools of GPU {pools.gpu_tokens:,} and host {pools.host_tokens:,} "
              f"tokens ({pools.offload_mode})", flush=True)
        print(step_header_line(column), flush=True)

    result = run_capacity(plan, on_step=lambda ratio, step: print(step_line(ratio, step, plan.out_dir, column),
                                                                  flush=True), on_pools=on_pools)
    checks = None
    if args.verify_fleet:
        from hstu_replay.capacity.fleet_check import check_dict, check_line, check_plan

        checks = check_plan(result, on_check=lambda check: print(check_line(check), flush=True))
    written = write_capacity(result, None if checks is None else [check_dict(c) for c in checks])
    data = capacity_dict(result)
    print(format_summary(data), flush=True)
    print(f"hstu-replay: capacity written to {plan.out_dir.resolve()} (open {written['html'].resolve()})", flush=True)
    if result.unsustainable:
        print(f"hstu-replay: FAIL: {_failure_line(data)}", file=sys.stderr, flush=True)
        return NO_SUSTAINABLE_STEP_EXIT
    missed = [c for c in checks or () if not c.meets_slo]
    if missed:
        print("hstu-replay: FAIL: the fleet the plan names misses its SLO at hit ratio "
              + ", ".join(f"{c.hit_ratio:g} ({c.servers} servers: {'; '.join(c.step.breaches)})" for c in missed),
              file=sys.stderr, flush=True)
        return NO_SUSTAINABLE_STEP_EXIT
    return 0


def _offload_mode(mode: str) -> str:
    from hstu_replay.plan.tiers import OFFLOAD_MODES

    if mode not in OFFLOAD_MODES:
        raise ConfigError(f"--offload-mode {mode!r}: use {' or '.join(OFFLOAD_MODES)}")
    return mode


@long_running
def _natural(args: argparse.Namespace) -> int:
    from hstu_replay.capacity.natural import NaturalPlan, plan_capacity, write_result
    from hstu_replay.capacity.search import Slo
    from hstu_replay.plan.over_limit import HistoryPolicy

    for flag in ("store", "repository", "slo_p99_ms", "request_rate"):
        if getattr(args, flag) is None:
            raise ConfigError(f"--{flag.replace('_', '-')} is required")
    if not Path(args.repository).is_dir():
        raise ConfigError(f"--repository {args.repository}: no such folder")
    serve_args = split_args("--serve-args", args.serve_args)
    batch = batch_number("--batch-size", args.batch_size)
    plan = NaturalPlan(
        store=args.store, repository=args.repository, out_dir=Path(args.out),
        slo=Slo(number("--slo-p99-ms", args.slo_p99_ms, 0, above=True),
                number("--slo-error-ratio", args.slo_error_ratio, 0)),
        request_rate=number("--request-rate", args.request_rate, 0, above=True),
        curve_ratios=numbers("--curve-ratios", args.curve_ratios, 0),
        budgets=tuple(int(b) for b in numbers("--budgets", args.budgets, 0, integral=True)) if args.budgets else (),
        max_servers=number("--max-servers", args.max_servers, 1, integral=True),
        shards_measured=number("--shards-measured", args.shards_measured, 0, integral=True),
        users=number("--users", args.users, 1, integral=True), batch_size=batch,
        time_slice_ms=number("--time-slice-ms", args.time_slice_ms, 0, integral=True),
        step_seconds=number("--step-seconds", args.step_seconds, 0, above=True),
        warmup_seconds=number("--warmup-seconds", args.warmup_seconds, 0),
        candidates=number("--candidates", args.candidates, 1, integral=True),
        max_history=number("--max-history", args.max_history, 1, integral=True),
        page_tokens=number("--page-tokens", args.page_tokens, 1, integral=True), serve_args=serve_args,
        policy=HistoryPolicy.of(args.over_limit, number("--rebase-keep", args.rebase_keep, 0, 1, above=True)),
        host_budgets=(tuple(sorted({int(b) for b in numbers("--host-budgets", args.host_budgets, 0, integral=True)}))
                      if args.host_budgets else ()),
        offload_mode=_offload_mode(args.offload_mode))
    from hstu_replay.data.store import open_store

    open_store(plan.store)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    result = plan_capacity(plan)
    path = write_result(result, plan.out_dir)
    answer = result["answer"]
    if answer is None:
        print(f"no budget measured meets p99 <= {plan.slo.p99_ms:g} ms at {plan.request_rate:g} req/s "
              f"with up to {plan.max_servers} server(s) (see {path})", file=sys.stderr)
        return NO_SUSTAINABLE_STEP_EXIT
    for point in result.get("frontier") or ():
        found = point["answer"]
        print(f"host tier {point['host_budget_tokens']:,} tokens: "
              + (f"GPU {found['budget_tokens']:,} tokens per server x {found['servers']} server(s)" if found
                 else "no GPU budget measured meets the SLO"))
    print(f"smallest cache meeting p99 <= {plan.slo.p99_ms:g} ms at {plan.request_rate:g} req/s: "
          f"{answer['budget_tokens']:,} tokens per server x {answer['servers']} server(s)"
          + (f" with a host tier of {answer['host_budget_tokens']:,} tokens each"
             if answer.get("host_budget_tokens") else "")
          + " (measured"
          + (f" on {answer['shards_measured']} of {answer['servers']} shards" if answer["servers"] > 1 else "")
          + f"; budgets picked from the computed curve); written to {path}")
    return 0
