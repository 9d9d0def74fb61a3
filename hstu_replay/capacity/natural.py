"""`hstu-replay capacity natural`: the smallest KV cache (and servers) that meets a latency SLO
when users come back as the log says they do.

The hit-ratio-vs-budget curve of the store's natural replay (computed, one pass) picks the
budgets worth measuring: where it reaches each of `--curve-ratios`. Each is then measured, in
ascending order: the built-in target is started with that `--cache-budget-tokens` and replayed
naturally at the traffic level (`--request-rate`); with n servers each gets 1/n of the users
(`--timeline-shard i/n`) and 1/n of the traffic. The first budget at which some server count up
to `--max-servers` meets the SLO is the answer (latency is taken to fall as the cache grows).
With n servers every shard i/n is measured in turn against its own fresh target (or the first
`--shards-measured` of them) and the step is judged on the worst shard (capacity.shards); the
curve's spread over all n shards is computed either way. A failed request's users go on with
fresh keys, and the window's curve figure is recomputed with that loss.
Every figure in capacity_natural.json says whether it was computed (the curve) or measured
(a real run: the server's own hit counters and the run's latency).

With host budgets (`--host-budgets`) the GPU search runs behind each host budget in turn: each
target gets that host pool behind the GPU budget being measured, the Locust client models both
tiers, and each step adds the token hit ratio per tier, computed from the two-tier curve
(`analysis.tier_curve`) and measured from the run's report (the server's word where it sends
HOST_CACHED_TOKENS). The result's `frontier` says, per host budget, the GPU memory that meets the
SLO; the answer is the pair needing the least GPU memory. The GPU budgets measured are the same
behind every host budget (picked from the one-tier curve, or given); the computed grid over both
is `plan cache-curve --budgets ... --host-budgets ...`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from hstu_replay.capacity.natural_page import HTML_NAME, render_html
from hstu_replay.capacity.pools import TargetPools, served
from hstu_replay.capacity.search import Measurement, Slo, judge
from hstu_replay.capacity.shards import combine, spread
from hstu_replay.capacity.step_run import StepRun, fresh_dir
from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.loadtest.command import headless_command
from hstu_replay.plan.over_limit import HistoryPolicy, accounts_line
from hstu_replay.process import STOP_GRACE_S

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
    page_tokens: int = DEFAULT_PAGE_TOKENS
    serve_args: tuple[str, ...] = ()  # e.g. --threads 1 --config small
    policy: HistoryPolicy = HistoryPolicy()  # --over-limit, --rebase-keep
    shards_measured: int = 0  # with n servers, measure shards 0..K-1 of n (0: all n)
    host_budget_tokens: int = 0  # a host tier of this many tokens behind every GPU budget (0: none)
    offload_mode: str = "flexkv"
    host_budgets: tuple[int, ...] = ()  # search the GPU budgets behind each of these host budgets in turn

    @property
    def host_args(self) -> tuple[str, ...]:
        """The host tier's options, for `server serve` and for the Locust client alike."""
        if not self.host_budget_tokens:
            return ()
        return ("--host-budget-tokens", str(self.host_budget_tokens), "--offload-mode", self.offload_mode)

    @property
    def limits(self) -> Limits:
        return Limits(max_history=self.max_history)


def _trace(plan: NaturalPlan):
    return _store_trace(plan.store, plan.candidates, plan.limits, plan.batch_size, plan.policy)


@lru_cache(maxsize=2)
def _store_trace(store: str, candidates: int, limits: Limits, batch_size: int, policy: HistoryPolicy):
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.plan.timeline import build_trace

    return build_trace(SequenceStore.open(store), candidates, limits, batch_size, policy)


def curves(plan: NaturalPlan) -> dict[int, list]:
    """servers n -> the curve of each server's share (shards 0..n-1 of n) of the store's natural replay."""
    from hstu_replay.analysis.cache_curve import cache_curve
    from hstu_replay.plan.timeline import group_requests, shard_trace

    trace, out = _trace(plan), {}
    for n in range(1, plan.max_servers + 1):
        out[n] = []
        for i in range(n):
            share = shard_trace(trace, i, n)
            out[n].append(cache_curve(share.cache_keys, share.tokens,
                                      group_requests(share, plan.time_slice_ms, plan.batch_size), plan.page_tokens))
    return out


def tier_curves(plan: NaturalPlan) -> dict[int, list]:
    """servers n -> the two-tier curve of each server's share; empty without a host tier."""
    from hstu_replay.analysis.tier_curve import tier_curve
    from hstu_replay.plan.timeline import group_requests, shard_trace

    if not plan.host_budget_tokens:
        return {}
    trace, out = _trace(plan), {}
    for n in range(1, plan.max_servers + 1):
        shares = [shard_trace(trace, i, n) for i in range(n)]
        out[n] = [tier_curve(s.cache_keys, s.tokens, group_requests(s, plan.time_slice_ms, plan.batch_size),
                             plan.page_tokens, plan.offload_mode) for s in shares]
    return out


def tier_figures(plan: NaturalPlan, tiers: list, budget: int, reports: list[dict | None]) -> dict:
    """A step's token hit ratio per tier: computed over the servers' shares of the log, and measured
    (the first stage of each shard's report, summed over the shards measured)."""
    hits = [t.hit_tokens(budget, plan.host_budget_tokens) for t in tiers]
    whole = max(sum(t.total_tokens for t in tiers), 1)
    measured = [((r or {}).get("stages") or [{}])[0].get("tiers") for r in reports]
    return {"host_budget_tokens": plan.host_budget_tokens, "offload_mode": plan.offload_mode,
            "computed": {"gpu_ratio": sum(g for g, _ in hits) / whole, "host_ratio": sum(h for _, h in hits) / whole},
            "measured": [None if m is None else {k: m[k] for k in ("gpu_ratio", "host_ratio", "mix", "source")}
                         for m in measured]}


def visit_kinds(plan: NaturalPlan) -> dict:
    """Every visit of the store's natural replay by kind under the plan's --over-limit: the whole
    log's, and each server's share (shard i of n) for each server count."""
    from hstu_replay.plan.timeline import shard_trace

    trace = _trace(plan)
    return {"log": trace.accounts().to_dict(plan.policy),
            "servers": {n: [shard_trace(trace, i, n).accounts().to_dict(plan.policy) for i in range(n)]
                        for n in range(1, plan.max_servers + 1)}}


def pick_budgets(curve, ratios: tuple[float, ...]) -> list[int]:
    """The smallest budget reaching each ratio the curve reaches, ascending, each once."""
    picked = {curve.budget_for(min(r, curve.max_ratio)) for r in ratios}
    return sorted(b for b in picked if b is not None)


def window_figures(plan: NaturalPlan, budget: int, servers: int, shard: int,
                   report: dict | None) -> tuple[int, int] | None:
    """(hit tokens, history tokens) of the curve over exactly the run's measured window: the
    replay is deterministic, so the hits of requests [warm-up, sent) are those of the first `sent`
    less the first `warm-up`. Visits that failed are taken out and their users go on with fresh
    keys, as the run did (`after_failures`): the curve less what the lost keys could not hit."""
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.analysis.cache_curve import cache_curve
    from hstu_replay.plan.timeline import after_failures, group_requests, shard_trace, visits_mask

    if report is None:
        return None
    warm = int(report.get("warmup_requests") or 0)
    sent = warm + sum(int(b["requests"]) + int(b.get("errors") or 0) for b in report.get("bins") or [])
    share = shard_trace(_trace(plan), shard, servers)
    bounds = group_requests(share, plan.time_slice_ms, plan.batch_size)
    if sent <= warm or sent >= len(bounds):
        return None
    failed = visits_mask(share, SequenceStore.open(plan.store).user_ids,
                         ((report.get("natural") or {}).get("failed") or {}).get("visits") or ())
    kept = after_failures(share, failed)
    position = np.concatenate([[0], np.cumsum(~failed)])  # a visit's index among those kept

    def first(n: int) -> tuple[int, int]:
        end = int(position[bounds[n]])
        curve = cache_curve(kept.cache_keys[:end], kept.tokens[:end], np.unique(position[bounds[: n + 1]]),
                            plan.page_tokens)
        return curve.hit_tokens(budget), curve.total_tokens

    (hits, tokens), (warm_hits, warm_tokens) = first(sent), first(warm)
    return hits - warm_hits, tokens - warm_tokens


def step_command(plan: NaturalPlan, grpc_url: str, budget: int, servers: int, shard: int,
                 report_dir: Path) -> list[str]:
    return headless_command(
        report_dir, "-u", str(plan.users), "-r", str(plan.users), "--triton-url", grpc_url, "--workload", "timeline",
        "--store", plan.store, "--timeline-shard", f"{shard}/{servers}", "--batch-sizes", str(plan.batch_size),
        "--time-slice-ms", str(plan.time_slice_ms), "--arrival", "constant",
        "--request-rate", f"{plan.request_rate / servers:g}", "--stage-seconds", f"{plan.step_seconds:g}",
        "--warmup-seconds", f"{plan.warmup_seconds:g}", "--max-history", str(plan.max_history),
        "--candidates", str(plan.candidates), "--cache-budget-tokens", str(budget),
        "--cache-page-tokens", str(plan.page_tokens),
        "--over-limit", plan.policy.over_limit.value, "--rebase-keep", f"{plan.policy.rebase_keep:g}",
        *plan.host_args,
    )


def run_natural_step(plan: NaturalPlan, budget: int, servers: int, shard: int) -> Measurement:
    """A fresh built-in target with `budget`, one natural replay of shard `shard` of `servers` at its
    share of the rate."""
    name = (f"b{budget}" + (f"_host{plan.host_budget_tokens}" if plan.host_budget_tokens else "") + f"_s{servers}"
            + (f"_shard{shard}" if servers > 1 else ""))
    step_dir = fresh_dir(plan.out_dir / "steps" / name)
    pools = TargetPools(budget, plan.host_budget_tokens, plan.offload_mode)
    with served(plan.repository, pools, step_dir / "server.log", ("--page-tokens", str(plan.page_tokens),
                                                                  *plan.serve_args)) as server:
        step = StepRun(name, step_command(plan, server.grpc_url, budget, servers, shard, step_dir), step_dir,
                       plan.warmup_seconds + plan.step_seconds + 120.0, stop_grace_s=STOP_GRACE_S)
        return step.measure(float(budget))


StepRunner = Callable[[NaturalPlan, int, int, int], Measurement]


def _measured(m: Measurement) -> dict:
    return {"hit_ratio": m.achieved_ratio, "hit_source": m.hit_source, "p99_ms": m.p99_ms, "p50_ms": m.p50_ms,
            "latency_basis": m.latency_basis, "error_ratio": m.error_ratio, "throughput_rps": m.throughput_rps,
            "requests": m.requests}


def _report(m: Measurement) -> dict | None:
    path = Path(m.report_dir or "") / "report.json"
    return json.loads(path.read_text()) if m.report_dir and path.is_file() else None


def measure_shards(plan: NaturalPlan, run: StepRunner, computed: list, budget: int, tiers: list | None = None) -> dict:
    """One step: shards 0..K-1 of n = len(computed) servers, each against its own fresh target, in
    turn; K is --shards-measured (all by default). The combined measurement is judged."""
    servers = len(computed)
    count = min(servers, plan.shards_measured or servers)
    shards, runs, windows, reports = [], [], [], []
    for i in range(count):
        m = run(plan, budget, servers, i)
        report = _report(m)
        reports.append(report)
        window = window_figures(plan, budget, servers, i, report)
        failed = ((report or {}).get("natural") or {}).get("failed") or {"requests": 0, "keys_replaced": 0}
        runs.append(m)
        windows.append(window)
        shards.append({"shard": i, "computed": {"hit_ratio": computed[i].ratio(budget),
                                                "window_hit_ratio": window[0] / window[1] if window and window[1]
                                                else None},
                       "measured": _measured(m), "failed": {k: failed[k] for k in ("requests", "keys_replaced")},
                       "report_dir": m.report_dir})
    combined = judge(combine(runs), plan.slo)
    known = [w for w in windows if w]
    window_tokens = sum(w[1] for w in known)
    m = combined.measurement
    return {
        "budget_tokens": budget, "servers": servers, "rate_per_server": plan.request_rate / servers,
        "shards_measured": count,
        "computed": {"hit_ratio": sum(c.hit_tokens(budget) for c in computed) / max(sum(c.total_tokens for c in
                                                                                      computed), 1),
                     "window_hit_ratio": (sum(w[0] for w in known) / window_tokens
                                          if len(known) == count and window_tokens else None)},
        "measured": _measured(m),
        "failed": {k: sum(s["failed"][k] for s in shards) for k in ("requests", "keys_replaced")},
        "spread": {"curve_ratio": spread([c.ratio(budget) for c in computed]),
                   "measured_p99_ms": spread([r.p99_ms for r in runs])},
        "shards": shards, "passed": combined.passed, "breaches": list(combined.breaches),
        "report_dir": runs[0].report_dir,
        "tiers": tier_figures(plan, tiers, budget, reports) if tiers else None,
    }


def step_line(plan: NaturalPlan, step: dict) -> str:
    """A step's figures for the terminal: the combined ones, then the spread over the shards."""
    m, c, servers = step["measured"], step["computed"], step["servers"]
    line = (f"budget {step['budget_tokens']:,} tokens x {servers} server(s) at {step['rate_per_server']:g} req/s "
            f"each: hit ratio {_fmt(m['hit_ratio'])} measured ({m['hit_source']}), "
            f"{_fmt(c['window_hit_ratio'])} computed for its window ({c['hit_ratio']:.4f} for the whole log), "
            f"p99 {_fmt(m['p99_ms'], '.1f')} ms: " + ("meets the SLO" if step["passed"] else "; ".join(step["breaches"])))
    if servers > 1:
        ratio, p99 = step["spread"]["curve_ratio"], step["spread"]["measured_p99_ms"]
        line += (f"\n  shards measured {step['shards_measured']} of {servers}"
                 + ("" if step["shards_measured"] == servers else " (the others are assumed alike)")
                 + f"; curve ratio over all {servers} shards {ratio['min']:.4f}..{ratio['max']:.4f}"
                 + (f"; measured p99 {p99['min']:.1f}..{p99['max']:.1f} ms (worst judged)" if p99 else ""))
    if step.get("tiers"):
        t = step["tiers"]
        line += (f"\n  host tier {t['host_budget_tokens']:,} tokens ({t['offload_mode']}): computed gpu hit "
                 f"{t['computed']['gpu_ratio']:.4f} host hit {t['computed']['host_ratio']:.4f}"
                 + "".join(f"; shard {i} measured gpu hit {_fmt(m['gpu_ratio'])} host hit {_fmt(m['host_ratio'])} "
                           f"({m['source']})" for i, m in enumerate(t["measured"]) if m))
    if step["failed"]["requests"]:
        line += (f"\n  {step['failed']['requests']} requests failed, {step['failed']['keys_replaced']} keys replaced "
                 "(the window's curve figure counts that loss)")
    return line


def search_budgets(plan: NaturalPlan, run: StepRunner, say: Callable[[str], None], computed: dict, two_tier: dict,
                   budgets: list[int]) -> tuple[list[dict], dict | None]:
    """GPU budgets in ascending order (and server counts) behind the plan's host budget, until one meets the SLO."""
    steps = []
    for budget in sorted(budgets):
        for servers in range(1, plan.max_servers + 1):
            step = measure_shards(plan, run, computed[servers], budget, two_tier.get(servers))
            steps.append(step)
            say(step_line(plan, step))
            if step["passed"]:
                return steps, {"budget_tokens": budget, "servers": servers, "total_tokens": budget * servers,
                               "shards_measured": step["shards_measured"],
                               **({"host_budget_tokens": plan.host_budget_tokens} if plan.host_budget_tokens else {})}
    return steps, None


def plan_capacity(plan: NaturalPlan, run: StepRunner = run_natural_step,
                  say: Callable[[str], None] = print) -> dict:
    """Measure budgets in ascending order until one meets the SLO; the result, labelled. With host
    budgets, the GPU search runs behind each in turn: per host budget the GPU memory it needs
    (`frontier`), and the answer is the pair needing the least GPU memory (then the least host)."""
    computed = curves(plan)
    hosts = plan.host_budgets or (plan.host_budget_tokens,)
    two_tier = tier_curves(replace(plan, host_budget_tokens=max(hosts)))
    kinds = visit_kinds(plan)
    say(accounts_line(kinds["log"]))
    budgets = list(plan.budgets) or pick_budgets(computed[1][0], plan.curve_ratios)
    if not budgets:
        raise ConfigError(f"--store {plan.store}: its curve reaches none of the ratios {plan.curve_ratios}")
    steps, frontier = [], []
    for host in sorted(hosts):
        found, answer = search_budgets(replace(plan, host_budget_tokens=host), run, say, computed,
                                       two_tier if host else {}, budgets)
        steps += found
        frontier.append({"host_budget_tokens": host, "answer": answer})
    answers = [f["answer"] for f in frontier if f["answer"]]
    answer = min(answers, key=lambda a: (a["total_tokens"], a.get("host_budget_tokens", 0)), default=None)
    return {
        "slo": asdict(plan.slo), "request_rate": plan.request_rate, "store": plan.store,
        "shards_measured": plan.shards_measured or None,
        "curve": {"computed": True, "budgets_picked_from_ratios": None if plan.budgets else list(plan.curve_ratios),
                  "servers": {n: [{"shard": i, "all_fit_tokens": c.all_fit_tokens, "max_ratio": c.max_ratio,
                                   "requests": c.requests} for i, c in enumerate(cs)] for n, cs in computed.items()},
                  "visit_kinds": kinds},
        "steps": steps, "answer": answer,
        **({"frontier": frontier} if plan.host_budgets else {}),
        "labels": {"computed": "from the one-pass curve of the store's natural replay, no server involved",
                   "measured": "from a real natural-replay run: the server's own hit counters, the run's latency; "
                               "with n servers, each shard against its own fresh target in turn, the worst "
                               "shard's p99 and error ratio, the shards' throughput added up"},
    }


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def write_result(result: dict, out_dir: Path) -> Path:
    """capacity_natural.json, and its page beside it."""
    path = out_dir / RESULT_JSON
    path.write_text(json.dumps(result, indent=2))
    (out_dir / HTML_NAME).write_text(render_html(result))
    return path
