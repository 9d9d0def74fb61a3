"""What a run's report is made of, gathered while it goes and read when it finishes.

The statistics (a worker's travel to its master with each Locust report and are added up there),
Triton's own split per stage and each server's counters behind a gateway, a natural replay's
request rows, the most users spawned at once, and how the run ended (stopped for a limit the
server refused, or interrupted by a signal). loadtest.finish builds the report from these alone.
"""

from __future__ import annotations

from hstu_replay.loadtest.records import RequestRows
from hstu_replay.stats.run_stats import RunStats


class RunFigures:
    """The report's inputs of one run, and the last report made of them."""

    def __init__(self, rows: RequestRows | None = None):
        self.stats = RunStats()
        self.rows = rows  # a natural replay's: its report reads every request
        self.server_stages: dict = {}  # bin name -> Triton queue/compute split (master / local)
        self.backend_stages: dict = {}  # bin name -> each server's own counters, behind a gateway
        self.users = 0  # the most users spawned at once (Locust's count is 0 again once the test stops)
        self.stopped: str | None = None  # why the run was stopped before its end (one line), if it was
        self.interruption = None  # loadtest.interrupts.Interruption: a signal ended the run while it went
        self.report: dict | None = None  # the last report written (what report.json holds)

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
