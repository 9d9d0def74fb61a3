"""Prepare and validate a run before its first request: options, model, data, schedule.

Everything that can be checked is checked here; a failure is one `HstuReplayError` line (exit 2
before any load). What comes out is frozen: the running phase only reads it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hstu_replay.client.triton import ModelBinding, TritonClient
from hstu_replay.errors import ConfigError, HstuReplayError, ServerError
from hstu_replay.loadtest.config import LoadTestConfig, TargetConfig
from hstu_replay.loadtest.dump_check import check_dump_answers
from hstu_replay.loadtest.schedule import Schedule
from hstu_replay.loadtest.server_limits import Cap, fit_to_server
from hstu_replay.loadtest.waiting import GREENLETS
from hstu_replay.plan.workloads import Workload, WorkloadKind, WorkloadOptions
from hstu_replay.stats.run_stats import NATURAL

if TYPE_CHECKING:
    from hstu_replay.loadtest.roles import Role



@dataclass(frozen=True)
class Placement:
    """Which process of a run this is."""

    role: Role
    worker_index: int = 0
    worker_count: int = 1


@dataclass(frozen=True)
class PreparedRun:
    config: LoadTestConfig
    placement: Placement
    binding: ModelBinding
    schedule: Schedule
    workload: Workload | None  # None on a master: its workers replay the data
    caps: tuple[Cap, ...] = ()  # options left at their defaults, capped to the server's published limits
    fleet_names: tuple[str, ...] = ()  # behind a gateway: each --fleet-metrics page's server, as it names itself

    @property
    def kind(self) -> WorkloadKind:
        return self.config.data.kind

    @property
    def paced_by_arrivals(self) -> bool:
        """Open loop whose send times come from the arrival clock (a natural replay's steps say when)."""
        return self.config.sweep.arrival.open and not self.kind.natural

    @property
    def caches(self) -> bool:
        """Whether hit ratios apply: the served model keeps a KV cache."""
        return self.binding.interface.uses_cache

    def history_caps(self) -> dict[int, int]:
        """Batch size -> longest history sent, where --max-values caps it below --max-history
        (the options say it, so a master knows its workers' caps without their data)."""
        data = self.config.data
        if not data.kind.caps_histories:
            return {}
        caps = {b: data.limits.history_cap(b, data.candidates) for b in self.config.sweep.batches}
        return {b: c for b, c in caps.items() if c < data.max_history}


def _asked(target: TargetConfig, server: int, question):
    client = TritonClient(target.client_options(server))
    try:
        return question(client)
    except HstuReplayError as exc:
        if len(target.addresses) == 1:
            raise
        raise type(exc)(f"server {target.addresses[server]} of the fleet: {exc}") from None
    finally:
        client.close()


def user_servers(target: TargetConfig):
    """A natural replay over a fleet by key: each log user's server (its keys are drawn to land
    there, so a request of one time slice's users goes to one server); None otherwise."""
    if len(target.addresses) < 2 or not target.routing.keeps_affinity:
        return None
    from hstu_replay.fleet.routing import router

    return router(target.routing, target.addresses).servers


def connect(target: TargetConfig) -> ModelBinding:
    """The served model's interface, the same at every server of a fleet (one line naming the
    server if one is not usable)."""
    bindings = [_asked(target, i, TritonClient.connect) for i in range(len(target.addresses))]
    for address, binding in zip(target.addresses[1:], bindings[1:]):
        if binding.limits != bindings[0].limits:
            raise ConfigError(f"server {address} publishes other limits for {target.model} ({binding.limits}) than "
                              f"{target.addresses[0]} ({bindings[0].limits}): a fleet serves one model")
        if binding != bindings[0]:
            raise ConfigError(f"server {address} serves {target.model} with another interface "
                              f"({binding.interface.name}) than {target.addresses[0]} ({bindings[0].interface.name}): "
                              "a fleet serves one model")
    return bindings[0]


def server_budgets(config: LoadTestConfig, binding: ModelBinding) -> LoadTestConfig:
    """Without budgets given, the pools' budgets each two-tier server's control model says (if it does)."""
    if config.cache.budgets_given or not binding.interface.uses_cache:
        return config
    addresses = config.target.addresses
    said = [_asked(config.target, i, TritonClient.server_budgets) for i in range(len(addresses))]
    if any(b is None for b in said):
        config.cache.check_mix()
        return config
    for address, budgets in zip(addresses, said):
        name = "the server" if len(addresses) == 1 else f"server {address}"
        print(f"hstu-replay: {name}'s control model gives its pools: GPU {budgets.gpu_tokens:,} tokens, host "
              f"{budgets.host_tokens:,} tokens (--cache-budget-tokens and --host-budget-tokens)", file=sys.stderr,
              flush=True)
    if len({b.host_tokens for b in said}) > 1:
        raise ConfigError("the fleet's servers have host tiers of different sizes; the client models one: give "
                          "--host-budget-tokens and --fleet-budgets")
    return config.with_budgets(said[0].gpu_tokens, said[0].host_tokens,
                               tuple(b.gpu_tokens for b in said) if len(said) > 1 else ())


def check_fleet_metrics(target: TargetConfig) -> tuple[str, ...]:
    """Behind a gateway: every server's metrics page answers, with the KV-cache counters, before any
    load. Each server's name: the gRPC address its page says it serves on, else the page's URL."""
    from hstu_replay.metrics import pages as metrics

    names = []
    for url in target.fleet_metrics:
        try:
            scrape = metrics.scrape(url)
        except (OSError, ValueError) as exc:
            raise ServerError(f"--fleet-metrics {url}: cannot scrape: {exc}") from None
        if scrape.total(metrics.CACHE_COUNTERS["requests"]) is None:
            raise ConfigError(f"--fleet-metrics {url}: no {metrics.CACHE_COUNTERS['requests']} series (give the "
                              "server's KV-cache metrics page, server serve --cache-metrics-port)")
        names.append(metrics.server_address(scrape) or url)
    return tuple(names)


def prepare(config: LoadTestConfig, placement: Placement, binding: ModelBinding | None = None) -> PreparedRun:
    if config.sweep.stage_requests and not placement.role.ends_stages_on_count:
        raise ConfigError("--stage-requests ends stages in one process; distributed stages end on --stage-seconds")
    binding = binding or connect(config.target)
    fleet_names = check_fleet_metrics(config.target) if placement.role.reports else ()
    config = server_budgets(config, binding)
    config, caps = fit_to_server(config, binding.limits)
    data, sweep = config.data, config.sweep
    workload = None
    if placement.role.replays:
        options = WorkloadOptions(path=data.path, candidates=data.candidates, limits=data.limits, seed=data.seed,
                                  worker_index=placement.worker_index, worker_count=placement.worker_count,
                                  time_scale=data.time_scale, request_rate=sweep.open_rate,
                                  slice_ms=data.time_slice_ms, shard=data.shard, policy=data.policy,
                                  tier_mix=config.cache.tier_mix, working_set=data.working_set,
                                  user_servers=user_servers(config.target), partial_hits=data.partial_hits,
                                  waiting=GREENLETS)
        workload = data.kind.opens(options)
        workload.check(sweep.batches)
        check_dump_answers(config, placement, binding, workload)
    ratios = sweep.ratios if binding.interface.uses_cache else (0.0,)  # nothing to hit: one cold stage
    if data.kind.natural:
        ratios = (NATURAL,)  # one stage: the hit ratio is whatever the server's cache gives
    schedule = Schedule(sweep.batches, ratios, sweep.warmup_seconds, sweep.stage_seconds)
    return PreparedRun(config, placement, binding, schedule, workload, caps, fleet_names)
