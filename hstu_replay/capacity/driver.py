"""Running the capacity search: each step is one real headless Locust run of `locustfiles/hstu.py`.

A step is a subprocess (bounded by a timeout) for one hit ratio and one load; it writes its full
normal report into `<out>/steps/h<ratio>_<load>/` and the driver reads that report's single bin.
Triton's Prometheus endpoint is scraped before and after each step (and its gauges while it runs).
With pools (`capacity.pools`) the whole search runs once per (GPU, host) pair against the reference
target served with them, its steps under `<out>/pools/g<G>_h<H>/`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from hstu_replay.metrics import pages as metrics
from hstu_replay.capacity.pools import TargetPools, served
from hstu_replay.capacity.search import Measurement, RatioResult, Slo, StepResult, step_until_breach, summarize
from hstu_replay.capacity.step_run import StepRun, fresh_dir
from hstu_replay.capacity.worker_count import DEFAULT_CORE_SHARE
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.loadtest.command import headless_command

STEPS_DIR = "steps"
POOLS_DIR = "pools"


# -- load kinds -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadKind:
    """How a load step is expressed: the option giving the steps, its unit, and its Locust args."""

    name: str
    flag: str
    unit: str
    column: str  # the load's column header in the step tables
    prefix: str  # of the step directory name: h0.50_u4, h0.50_r20
    integral: bool
    args: Callable[[float, "CapacityPlan"], list[str]]

    def label(self, load: float) -> str:
        return f"{self.prefix}{load:g}"


def _closed_loop(users: float, plan: CapacityPlan) -> list[str]:
    n = str(int(users))
    return ["-u", n, "-r", n]


def _open_loop(rate: float, plan: CapacityPlan) -> list[str]:
    n = str(plan.rate_users)
    return ["-u", n, "-r", n, "--arrival", "poisson", "--request-rate", f"{rate:g}"]


LOAD_KINDS: dict[str, LoadKind] = {
    "users": LoadKind("users", "--users-steps", "concurrent users", "users", "u", True, _closed_loop),
    "rate": LoadKind("rate", "--rate-steps", "offered requests/s", "offered req/s", "r", False, _open_loop),
}


# -- the plan ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CapacityPlan:
    hit_ratios: tuple[float, ...]
    load_kind: LoadKind
    loads: tuple[float, ...]
    slo: Slo
    out_dir: Path
    batch_size: int = 1
    step_seconds: float = 10.0
    warmup_seconds: float = 2.0
    rate_users: int = 8
    target_rps: float | None = None
    worker_cpu_share: float = DEFAULT_CORE_SHARE  # of a core, per Locust worker (capacity.worker_count)
    model: str = "hstu_gr_ranking_kvcache"
    workload_args: tuple[str, ...] = ()  # --workload, --dump-dir, --triton-url, ... as given
    locust_args: tuple[str, ...] = ()  # anything else, e.g. --master --expect-workers 2
    metrics_url: str | None = None
    cache_metrics_url: str | None = None
    step_timeout_s: float = 130.0
    pools: tuple[TargetPools, ...] = ()  # serve the reference target with each in turn (none: the given server)
    repository: str | None = None  # the reference target's model repository, with pools
    serve_args: tuple[str, ...] = ()  # more `server serve` options, with pools

    def step_name(self, ratio: float, load: float) -> str:
        return f"h{ratio:.2f}_{self.load_kind.label(load)}"

    def step_dir(self, ratio: float, load: float) -> Path:
        return self.out_dir / STEPS_DIR / self.step_name(ratio, load)


def step_command(plan: CapacityPlan, ratio: float, load: float, report_dir: Path) -> list[str]:
    """The Locust command line of one step: the step's own options, then the pass-through ones."""
    return headless_command(
        report_dir, *plan.load_kind.args(load, plan),
        "--hit-ratios", f"{ratio:g}", "--batch-sizes", str(plan.batch_size),
        "--stage-seconds", f"{plan.step_seconds:g}", "--warmup-seconds", f"{plan.warmup_seconds:g}",
        "--triton-model", plan.model, *plan.workload_args, *plan.locust_args,
    )


# -- one step ---------------------------------------------------------------------------------

def run_step(plan: CapacityPlan, ratio: float, load: float) -> Measurement:
    """One real Locust run; raises ServerError when Locust refuses to start (bad options, no server)."""
    step_dir = fresh_dir(plan.step_dir(ratio, load))
    before = metrics.try_scrape(plan.metrics_url)
    cache_before = metrics.try_scrape(plan.cache_metrics_url)
    during: list[metrics.Scrape] = []

    def sample() -> None:
        scrape = metrics.try_scrape(plan.metrics_url)
        if scrape is not None:
            during.append(scrape)

    step = StepRun(plan.step_name(ratio, load), step_command(plan, ratio, load, step_dir), step_dir,
                   plan.step_timeout_s, sample=sample if plan.metrics_url else None)
    measured = step.measure(load)
    after = metrics.try_scrape(plan.metrics_url)
    return replace(measured, metrics=metrics.step_metrics(before, after, during, plan.model, cache_before,
                                                          metrics.try_scrape(plan.cache_metrics_url)))


# -- the whole search -------------------------------------------------------------------------

StepRunner = Callable[[CapacityPlan, float, float], Measurement]


@dataclass(frozen=True)
class PoolsResult:
    """The search at every hit ratio against the target served with one pair of pools."""

    pools: TargetPools
    ratios: tuple[RatioResult, ...]


@dataclass(frozen=True)
class CapacityResult:
    plan: CapacityPlan
    ratios: tuple[RatioResult, ...]  # with pools: every pair's, in the order of `by_pools`
    created: str
    by_pools: tuple[PoolsResult, ...] = ()

    @property
    def unsustainable(self) -> list[float]:
        """Hit ratios at which no step met the SLO."""
        return [r.hit_ratio for r in self.ratios if r.sustainable is None]

    def pools_of(self) -> list[TargetPools | None]:
        """The pools each of `ratios` was measured with (None: the given server)."""
        if not self.by_pools:
            return [None] * len(self.ratios)
        return [group.pools for group in self.by_pools for _ in group.ratios]


def check_endpoints(plan: CapacityPlan) -> None:
    """Scrape each metrics endpoint once before any load: a wrong address fails in one line."""
    checks = ((plan.metrics_url, "--metrics-url", "nv_inference_request_success", {"model": plan.model}),
              (plan.cache_metrics_url, "--cache-metrics-url", "hstu_kvcache_hit_tokens_total", {}))
    for url, flag, name, labels in checks:
        if not url:
            continue
        try:
            scrape = metrics.scrape(url)
        except (OSError, ValueError) as exc:
            raise ServerError(f"{flag} {url}: cannot scrape: {exc}") from None
        if scrape.total(name, **labels) is None:
            what = f" for model {plan.model!r}" if labels else ""
            raise ConfigError(f"{flag} {url}: no {name} series{what}")


def _search(plan: CapacityPlan, run: StepRunner,
            on_step: Callable[[float, StepResult], None] | None) -> tuple[RatioResult, ...]:
    results = []
    for ratio in plan.hit_ratios:
        report = (lambda step, r=ratio: on_step(r, step)) if on_step else None
        steps = step_until_breach(plan.loads, lambda load, r=ratio: run(plan, r, load), plan.slo, report)
        results.append(summarize(ratio, steps, plan.target_rps))
    return tuple(results)


def pools_plan(plan: CapacityPlan, pools: TargetPools, grpc_url: str) -> CapacityPlan:
    """The search against the target served with `pools` at `grpc_url`: steps under its own folder."""
    return replace(plan, out_dir=plan.out_dir / POOLS_DIR / pools.name, pools=(),
                   workload_args=(*plan.workload_args, "--triton-url", grpc_url))


def run_capacity(plan: CapacityPlan, run: StepRunner = run_step,
                 on_step: Callable[[float, StepResult], None] | None = None,
                 on_pools: Callable[[TargetPools], None] | None = None) -> CapacityResult:
    """Step the load at every hit ratio until the SLO breaks (at most len(loads) steps each); with
    pools, once per pair against a fresh reference target served with it."""
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if not plan.pools:
        return CapacityResult(plan, _search(plan, run, on_step), created)
    groups = []
    for pools in plan.pools:
        if on_pools is not None:
            on_pools(pools)
        folder = plan.out_dir / POOLS_DIR / pools.name
        folder.mkdir(parents=True, exist_ok=True)
        with served(plan.repository, pools, folder / "server.log", plan.serve_args) as server:
            groups.append(PoolsResult(pools, _search(pools_plan(plan, pools, server.grpc_url), run, on_step)))
    return CapacityResult(plan, tuple(r for g in groups for r in g.ratios), created, tuple(groups))
