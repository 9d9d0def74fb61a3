"""Prepare and validate a run before its first request: options, model, data, schedule.

Everything that can be checked is checked here; a failure is one `HstuReplayError` line (exit 2
before any load). What comes out is frozen: the running phase only reads it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hstu_replay.client.triton import ModelBinding, TritonClient
from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.config import LoadTestConfig, TargetConfig
from hstu_replay.loadtest.schedule import Schedule
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
        """Batch size -> longest history sent, where --max-values caps it below --max-history."""
        if self.workload is None:
            return {}
        caps = {b: self.workload.history_cap(b) for b in self.config.sweep.batches}
        return {b: c for b, c in caps.items() if c is not None and c < self.config.data.max_history}


def connect(target: TargetConfig) -> ModelBinding:
    """The served model's interface (one line if the server or model is not usable)."""
    client = TritonClient(target.client_options())
    try:
        return client.connect()
    finally:
        client.close()


def server_budgets(config: LoadTestConfig, binding: ModelBinding) -> LoadTestConfig:
    """Without budgets given, the pools' budgets a two-tier server's control model says (if it does)."""
    if config.cache.budgets_given or not binding.interface.uses_cache:
        return config
    client = TritonClient(config.target.client_options())
    try:
        budgets = client.server_budgets()
    finally:
        client.close()
    if budgets is None:
        config.cache.check_mix()
        return config
    print(f"hstu-replay: the server's control model gives its pools: GPU {budgets.gpu_tokens:,} tokens, host "
          f"{budgets.host_tokens:,} tokens (--cache-budget-tokens and --host-budget-tokens)", file=sys.stderr,
          flush=True)
    return config.with_budgets(budgets.gpu_tokens, budgets.host_tokens)


def prepare(config: LoadTestConfig, placement: Placement, binding: ModelBinding | None = None) -> PreparedRun:
    if config.sweep.stage_requests and not placement.role.ends_stages_on_count:
        raise ConfigError("--stage-requests ends stages in one process; distributed stages end on --stage-seconds")
    binding = binding or connect(config.target)
    config = server_budgets(config, binding)
    data, sweep = config.data, config.sweep
    workload = None
    if placement.role.replays:
        options = WorkloadOptions(data.path, data.candidates, data.limits, data.seed, placement.worker_index,
                                  placement.worker_count, data.time_scale, sweep.open_rate, data.time_slice_ms,
                                  data.shard, data.policy, config.cache.tier_mix,
                                  data.working_set)
        workload = data.kind.opens(options)
        workload.check(sweep.batches)
    ratios = sweep.ratios if binding.interface.uses_cache else (0.0,)  # nothing to hit: one cold stage
    if data.kind.natural:
        ratios = (NATURAL,)  # one stage: the hit ratio is whatever the server's cache gives
    schedule = Schedule(sweep.batches, ratios, sweep.warmup_seconds, sweep.stage_seconds)
    return PreparedRun(config, placement, binding, schedule, workload)
