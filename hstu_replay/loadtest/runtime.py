"""A Locust process's hstu-replay state: who it is, and the run in progress.

A run's lifecycle, one object per phase: `PreparedRun` (validated, connected, data open; frozen:
loadtest.prepare) -> `LiveRun` (the sweep clock, the fleet's cache models, the accountant, clients,
the records being written: loadtest.live) -> finish (loadtest.finish writes the report from the
`RunFigures`: loadtest.figures). `ActiveRun` holds the three; one instance hangs off the Locust
environment (`environment.hstu.run`), and a rerun from the web UI starts a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hstu_replay.client.triton import ModelBinding
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.figures import RunFigures
from hstu_replay.loadtest.live import LiveRun, record_writer
from hstu_replay.loadtest.prepare import Placement, PreparedRun
from hstu_replay.loadtest.records import RequestRows

if TYPE_CHECKING:
    from hstu_replay.loadtest.roles import Role


@dataclass(frozen=True)
class ActiveRun:
    """One test of one process, from its start to the next one: what was prepared, what goes on
    while it runs, and what its report is made of."""

    prepared: PreparedRun
    live: LiveRun
    figures: RunFigures

    @classmethod
    def start(cls, prepared: PreparedRun) -> ActiveRun:
        records = record_writer(prepared)
        figures = RunFigures(RequestRows(records) if prepared.kind.natural else None)
        return cls(prepared, LiveRun(prepared, figures, records), figures)

    def close(self) -> None:
        self.live.close()


@dataclass
class LoadTestRuntime:
    config: LoadTestConfig | None  # as last parsed (the web UI may change it between runs); a worker's
    # arrives with each test start
    role: Role
    run: ActiveRun | None = None
    binding: ModelBinding | None = None  # detected at init (headless), before any run
    secrets: dict = field(default_factory=dict, repr=False)  # this process's own (options.take_secrets)

    @property
    def placement(self) -> Placement:
        return Placement(self.role, self.role.worker_index, self.role.worker_count)

    def drop_run(self) -> None:
        if self.run is not None:
            self.run.close()
            self.run = None

    def stop_run(self, message: str) -> None:
        """Stop the whole run, once, for `message` (the first limit the server refused)."""
        if self.run is None or self.run.figures.stopped is not None:
            return
        self.run.figures.stopped = message
        self.role.stop_run(message)

    def begin(self, prepared: PreparedRun) -> ActiveRun:
        self.drop_run()
        self.config, self.binding = prepared.config, prepared.binding
        self.run = ActiveRun.start(prepared)
        return self.run

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
