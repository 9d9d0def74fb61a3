"""A run while it goes: what its users share between the sweep's start and test stop.

The sweep clock, the fleet's cache models and availability, the accountant filing each request
(into the run's figures and its records file), the Triton clients opened, the virtual users'
numbering and the warnings said once. Built from a prepared run (loadtest.prepare), which it
only reads; what the report needs stays in loadtest.figures.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from hstu_replay.loadtest.figures import RunFigures
from hstu_replay.loadtest.fleet import Fleet
from hstu_replay.loadtest.prepare import PreparedRun
from hstu_replay.loadtest.records import RecordWriter
from hstu_replay.loadtest.schedule import SweepClock
from hstu_replay.plan.workloads import StepSource
from hstu_replay.stats.accounting import Accountant

SAID_AT_MOST = 100  # distinct warnings said once each; past this many, the rest are not said


class Notices:
    """Lines for the user on stderr; a warning that repeats (per request) said once."""

    def __init__(self):
        self._said: set[str] = set()

    @staticmethod
    def say(message: str) -> None:
        print(f"hstu-replay: {message}", file=sys.stderr, flush=True)

    def say_once(self, message: str) -> None:
        """A warning on stderr the first time it occurs (planning errors repeat per request)."""
        if message not in self._said and len(self._said) < SAID_AT_MOST:
            self._said.add(message)
            self.say(f"warning: {message}")


def record_writer(prepared: PreparedRun) -> RecordWriter | None:
    """The records file of a process that sends requests (None on a master)."""
    placement = prepared.placement
    if not placement.role.replays:
        return None
    return RecordWriter(Path(prepared.config.report.report_dir), f"{placement.role.name}{placement.worker_index}")


class LiveRun:
    """One test of one process while it goes, from its start to test stop."""

    def __init__(self, prepared: PreparedRun, figures: RunFigures, records: RecordWriter | None):
        self.prepared = prepared
        self.notices = Notices()
        self.clock = SweepClock(prepared.schedule, prepared.config.sweep.stage_requests)
        placement = prepared.placement
        self.fleet = Fleet(prepared.config, placement.worker_count, figures.stats, self.notices.say)
        self.records = records
        sink = records if figures.rows is None else figures.rows
        self.accountant = Accountant(figures.stats, sink, placement.worker_index)
        self.ended = False  # set at test stop
        self._users = itertools.count()
        self._clients: list = []

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

        client = TritonClient(self.prepared.config.target.client_options(max(server, 0)))
        client.binding = self.prepared.binding
        self._clients.append(client)
        return client

    def end(self) -> None:
        """Test stop: nothing more is sent; an outage still going counts up to the end."""
        self.ended = True
        for server in self.fleet.servers:
            server.availability.settle()

    def close(self) -> None:
        self.ended = True
        while self._clients:
            self._clients.pop().close()
        if self.records is not None:
            self.records.close()
