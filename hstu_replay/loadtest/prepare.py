"""Prepare and validate a run before its first request: options, model, data, schedule.

Everything that can be checked is checked here; a failure is one `HstuReplayError` line (exit 2
before any load). What comes out is frozen: the running phase only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay.client.triton import ModelBinding, TritonClient
from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.options import LoadTestConfig
from hstu_replay.loadtest.schedule import Schedule
from hstu_replay.plan.workloads import Workload, WorkloadOptions, open_workload

NATURAL = float("nan")  # the target ratio of a natural-replay stage: none, the ratio emerges


@dataclass(frozen=True)
class Placement:
    """Which process of a run this is."""

    role: str  # local | master | worker
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
    def caches(self) -> bool:
        """Whether hit ratios apply: the served model keeps a KV cache."""
        return self.binding.interface.uses_cache

    def history_caps(self) -> dict[int, int]:
        """Batch size -> longest history sent, where --max-values caps it below --max-history."""
        if self.workload is None:
            return {}
        caps = {b: self.workload.history_cap(b) for b in self.config.batches}
        return {b: c for b, c in caps.items() if c is not None and c < self.config.max_history}


def connect(config: LoadTestConfig) -> ModelBinding:
    """The served model's interface (one line if the server or model is not usable)."""
    client = TritonClient(config.client_options())
    try:
        return client.connect()
    finally:
        client.close()


def prepare(config: LoadTestConfig, placement: Placement, binding: ModelBinding | None = None) -> PreparedRun:
    if config.stage_requests and placement.role != "local":
        raise ConfigError("--stage-requests ends stages in one process; distributed stages end on --stage-seconds")
    binding = binding or connect(config)
    workload = None
    if placement.role != "master":
        options = WorkloadOptions(config.dump_dir if config.workload == "dumps" else config.store,
                                  config.candidates, config.limits, config.seed, placement.worker_index,
                                  placement.worker_count, config.time_scale,
                                  config.request_rate if config.arrival != "closed" else 0.0, config.time_slice_ms,
                                  config.shard)
        workload = open_workload(config.workload, options)
        workload.check(config.batches)
    ratios = config.ratios if binding.interface.uses_cache else (0.0,)  # nothing to hit: one cold stage
    if config.workload == "timeline":
        ratios = (NATURAL,)  # one stage: the hit ratio is whatever the server's cache gives
    schedule = Schedule(config.batches, ratios, config.warmup_seconds, config.stage_seconds)
    return PreparedRun(config, placement, binding, schedule, workload)
