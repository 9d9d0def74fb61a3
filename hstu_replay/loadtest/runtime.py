"""A Locust process's hstu-replay state: who it is, and the run in progress.

The run's lifecycle: `prepare` (validate, connect, open data: loadtest.prepare) -> `ActiveRun`
(the sweep clock, the fleet's cache models, the accountant, clients) -> finish (loadtest.finish
writes the report from the run's statistics). One instance hangs off the Locust environment
(`environment.hstu`); a rerun from the web UI starts a new `ActiveRun`.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hstu_replay.client.triton import ModelBinding
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.fleet import Fleet
from hstu_replay.loadtest.prepare import Placement, PreparedRun
from hstu_replay.loadtest.records import RecordWriter, RequestRows
from hstu_replay.loadtest.schedule import SweepClock
from hstu_replay.plan.workloads import StepSource
from hstu_replay.stats.accounting import Accountant
from hstu_replay.stats.run_stats import RunStats

if TYPE_CHECKING:
    from hstu_replay.loadtest.roles import Role


class ActiveRun:
    """One test of one process, from its start to the next one."""

    def __init__(self, prepared: PreparedRun):
        self.prepared = prepared
        self.config = prepared.config
        self.clock = SweepClock(prepared.schedule, self.config.sweep.stage_requests)
        self.stats = RunStats()
        self.server_stages: dict = {}  # bin name -> Triton queue/compute split (master / local)
        self.backend_stages: dict = {}  # bin name -> each server's own counters, behind a gateway
        placement = prepared.placement
        self.fleet = Fleet(self.config, placement.worker_count, self.stats, self.say)
        self.records = None
        if placement.role.replays:
            self.records = RecordWriter(Path(self.config.report.report_dir),
                                        f"{placement.role.name}{placement.worker_index}")
        self.rows = RequestRows(self.records) if prepared.kind.natural else None  # its report reads every request
        self.accountant = Accountant(self.stats, self.records if self.rows is None else self.rows,
                                     placement.worker_index)
        self._users = itertools.count()
        self._clients: list = []
        self._said: set[str] = set()
        self.ended = False  # set at test stop
        self.interruption = None  # loadtest.interrupts.Interruption: a signal ended the run while it went
        self.stopped: str | None = None  # why the run was stopped before its end (one line), if it was
        self.report: dict | None = None  # the last report written (what report.json holds)
        self.users = 0  # the most users spawned at once (Locust's count is 0 again once the test stops)

    def report_to_master(self) -> dict:
        """What a worker's Locust report carries: what it counted since its last one."""
        data = {"hstu": self.stats.take().to_dict()}
        if self.rows is not None:
            data["hstu_rows"] = self.rows.take()
        return data

    def merge_worker_report(self, data: dict) -> int:
        """At the master: a worker's report added to the run's figures; the measured requests it carried."""
        measured = 0
        if "hstu" in data:
            stats = RunStats.from_dict(data["hstu"])
            measured = sum(s.requests for s in stats.bins.values())
            self.stats.merge(stats)
        if "hstu_rows" in data and self.rows is not None:
            self.rows.merge(data["hstu_rows"])
        return measured

    def new_user_index(self) -> int:
        return next(self._users)

    def source_for(self, user_index: int) -> StepSource:
        placement = self.prepared.placement
        who = (placement.worker_index, user_index, placement.worker_count)
        return self.prepared.workload.source(self.fleet.keys(*who), self.fleet.planning_cache(*who))

    def open_client(self, server: int = 0):
        """A Triton client of the fleet's server `server`, closed by `close()` at the latest: a gRPC
        channel left to the interpreter's teardown can hang the process at exit."""
        from hstu_replay.client.triton import TritonClient

        client = TritonClient(self.config.target.client_options(max(server, 0)))
        client.binding = self.prepared.binding
        self._clients.append(client)
        return client

    def say(self, message: str) -> None:
        print(f"hstu-replay: {message}", file=sys.stderr, flush=True)

    def say_once(self, message: str) -> None:
        """A warning on stderr the first time it occurs (planning errors repeat per request)."""
        if message not in self._said and len(self._said) < 100:
            self._said.add(message)
            self.say(f"warning: {message}")

    def close(self) -> None:
        self.ended = True
        while self._clients:
            self._clients.pop().close()
        if self.records is not None:
            self.records.close()


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
        if self.run is None or self.run.stopped is not None:
            return
        self.run.stopped = message
        self.role.stop_run(message)

    def begin(self, prepared: PreparedRun) -> ActiveRun:
        self.drop_run()
        self.config, self.binding = prepared.config, prepared.binding
        self.run = ActiveRun(prepared)
        return self.run

    def close(self) -> None:
        if self.run is not None:
            self.run.close()
