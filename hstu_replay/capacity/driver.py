"""Running the capacity search: each step is one real headless Locust run of `locustfiles/hstu.py`.

A step is a subprocess (bounded by a timeout) for one hit ratio and one load; it writes its full
normal report into `<out>/steps/h<ratio>_<load>/` and the driver reads that report's single bin.
Triton's Prometheus endpoint is scraped before and after each step (and its gauges while it runs).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from hstu_replay.capacity import metrics
from hstu_replay.capacity.search import Measurement, RatioResult, Slo, StepResult, step_until_breach, summarize
from hstu_replay.capacity.workers import DEFAULT_CORE_SHARE
from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.loadtest.command import headless_command

STEPS_DIR = "steps"
LOG_NAME = "locust.log"
GAUGE_PERIOD_S = 2.0  # Triton refreshes its GPU/CPU gauges every 2 s by default
KILL_GRACE_S = 15.0  # after SIGTERM, Locust writes its report; then SIGKILL
LOCUST_BAD_START = 2  # Locust's (and hstu-replay's) exit code for bad options / unreachable server


# -- load kinds -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadKind:
    """How a load step is expressed: the option giving the steps, its unit, and its Locust args."""

    name: str
    flag: str
    unit: str
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
    "users": LoadKind("users", "--users-steps", "concurrent users", "u", True, _closed_loop),
    "rate": LoadKind("rate", "--rate-steps", "offered requests/s", "r", False, _open_loop),
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
    worker_cpu_share: float = DEFAULT_CORE_SHARE  # of a core, per Locust worker (capacity.workers)
    model: str = "hstu_gr_ranking_kvcache"
    workload_args: tuple[str, ...] = ()  # --workload, --dump-dir, --triton-url, ... as given
    locust_args: tuple[str, ...] = ()  # anything else, e.g. --master --expect-workers 2
    metrics_url: str | None = None
    cache_metrics_url: str | None = None
    step_timeout_s: float = 130.0

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

def fresh_dir(path: Path) -> Path:
    """The step's directory, emptied: records of an earlier run must not mix into this one."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def stop_step(proc: subprocess.Popen, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group (Locust then writes its report), SIGKILL after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_step(proc: subprocess.Popen, timeout_s: float, sample: Callable[[], None] | None) -> bool:
    """Wait for the step, sampling gauges every GAUGE_PERIOD_S; True when it ran past timeout_s."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            proc.wait(min(GAUGE_PERIOD_S, left))
            return False
        except subprocess.TimeoutExpired:
            if sample is not None and deadline - time.monotonic() > 0:
                sample()
    stop_step(proc)
    return True


def last_error(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("hstu-replay: error")]
    return (errors or lines or ["(no output)"])[-1]


def measurement_from_report(report: dict, load: float) -> Measurement:
    """The single bin of a step's report.json; open loop is judged from the intended send time."""
    bins = report.get("bins") or []
    if not bins:
        return Measurement(load, problem="the report has no measured bin")
    b = bins[0]
    corrected = b.get("corrected_p99_ms") is not None

    def latency(key: str) -> float | None:
        return b.get(f"corrected_{key}") if corrected else b.get(key)

    errors = report.get("errors") or {}
    stage = (report.get("stages") or [{}])[0]
    flags = stage.get("flags") or []
    per_request = stage.get("mean_history_tokens")
    return Measurement(
        load=load, requests=int(b.get("requests") or 0), throughput_rps=b.get("throughput_rps"),
        logical_throughput=b.get("logical_throughput"), mean_ms=latency("mean_ms"), p50_ms=latency("p50_ms"),
        p99_ms=latency("p99_ms"), error_ratio=b.get("error_ratio"), achieved_ratio=b.get("achieved_ratio"),
        hit_source=b.get("hit_source"),
        history_tokens=None if per_request is None or math.isnan(per_request) else
        round(per_request * int(b.get("logical_requests") or 0)),
        primes_per_request=b.get("primes_per_request"), server_rps=b.get("server_rps"),
        latency_basis="intended" if corrected else "sent", requested_rps=b.get("requested_rps"),
        server=b.get("server"), errors=dict(list(errors.items())[:3]) or None,
        client_cpu_ms_per_request=stage.get("client_cpu_ms_per_request"),
        client_bound=any(f.get("flag") == "client-bound" for f in flags),
    )


def run_step(plan: CapacityPlan, ratio: float, load: float) -> Measurement:
    """One real Locust run; raises ServerError when Locust refuses to start (bad options, no server)."""
    step_dir = fresh_dir(plan.step_dir(ratio, load))
    log = step_dir / LOG_NAME
    model = plan.model
    before = metrics.try_scrape(plan.metrics_url)
    cache_before = metrics.try_scrape(plan.cache_metrics_url)
    during: list[metrics.Scrape] = []

    def sample() -> None:
        scrape = metrics.try_scrape(plan.metrics_url)
        if scrape is not None:
            during.append(scrape)

    with log.open("w") as out:
        proc = subprocess.Popen(step_command(plan, ratio, load, step_dir), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                start_new_session=True)
        try:
            timed_out = wait_step(proc, plan.step_timeout_s, sample if plan.metrics_url else None)
        except BaseException:  # Ctrl-C reaches only us: the step runs in its own session
            stop_step(proc)
            raise
    after = metrics.try_scrape(plan.metrics_url)
    step_metrics = metrics.step_metrics(before, after, during, model, cache_before,
                                        metrics.try_scrape(plan.cache_metrics_url))
    name = plan.step_name(ratio, load)
    if proc.returncode == LOCUST_BAD_START and not timed_out:
        raise ServerError(f"step {name}: Locust stopped: {last_error(log)} (log: {log})")
    report_path = step_dir / "report.json"
    if report_path.is_file():
        measured = measurement_from_report(json.loads(report_path.read_text()), load)
    else:
        measured = Measurement(load, problem=f"Locust exited {proc.returncode} without a report: {last_error(log)}")
    problem = f"timed out after {plan.step_timeout_s:g} s" if timed_out else measured.problem
    return replace(measured, metrics=step_metrics, report_dir=str(step_dir), returncode=proc.returncode,
                   problem=problem)


# -- the whole search -------------------------------------------------------------------------

StepRunner = Callable[[CapacityPlan, float, float], Measurement]


@dataclass(frozen=True)
class CapacityResult:
    plan: CapacityPlan
    ratios: tuple[RatioResult, ...]
    created: str

    @property
    def unsustainable(self) -> list[float]:
        """Hit ratios at which no step met the SLO."""
        return [r.hit_ratio for r in self.ratios if r.sustainable is None]


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


def run_capacity(plan: CapacityPlan, run: StepRunner = run_step,
                 on_step: Callable[[float, StepResult], None] | None = None) -> CapacityResult:
    """Step the load at every hit ratio until the SLO breaks (at most len(loads) steps each)."""
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results = []
    for ratio in plan.hit_ratios:
        report = (lambda step, r=ratio: on_step(r, step)) if on_step else None
        steps = step_until_breach(plan.loads, lambda load, r=ratio: run(plan, r, load), plan.slo, report)
        results.append(summarize(ratio, steps, plan.target_rps))
    return CapacityResult(plan, tuple(results), created)
