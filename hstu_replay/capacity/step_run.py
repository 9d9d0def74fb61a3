"""One capacity step: a headless Locust child started, awaited and stopped in one place.

Both capacity searches (`capacity` over hit ratios and loads, `capacity natural` over cache
budgets) measure a step the same way: the Locust command runs as a `process.Child` in a session of
its own with its output in the step's log, bounded by a time-out (sampling the server's gauges
while it waits if asked); a timed-out or interrupted step's session is sent SIGTERM (Locust then
writes its report) and SIGKILL after a grace period. The step's report.json holds one measured bin, which becomes the
step's `Measurement`; a step Locust refused to start (bad options, no server) is a ServerError.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hstu_replay.capacity.search import Measurement
from hstu_replay.errors import ServerError
from hstu_replay.process import Child, Stopping, log_error_line, log_reason

LOG_NAME = "locust.log"
REPORT_NAME = "report.json"
GAUGE_PERIOD_S = 2.0  # Triton refreshes its GPU/CPU gauges every 2 s by default
KILL_GRACE_S = 15.0  # after SIGTERM, Locust writes its report; then SIGKILL
LOCUST_BAD_START = 2  # Locust's (and hstu-replay's) exit code for bad options / unreachable server


def fresh_dir(path: Path) -> Path:
    """The step's directory, emptied: records of an earlier run must not mix into this one."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


@dataclass(frozen=True)
class StepRun:
    """A Locust step to run: its name (for messages), command, directory and bounds."""

    name: str
    command: Sequence[str]
    step_dir: Path
    timeout_s: float
    stop_grace_s: float = KILL_GRACE_S
    sample: Callable[[], None] | None = None  # called every GAUGE_PERIOD_S while the step runs

    @property
    def log(self) -> Path:
        return self.step_dir / LOG_NAME

    def measure(self, load: float) -> Measurement:
        """Run the step to its end (or its time-out) and read its measurement at `load`."""
        returncode, timed_out = self._run()
        if returncode == LOCUST_BAD_START and not timed_out:
            raise ServerError(f"step {self.name}: Locust stopped{log_reason(self.log)}")
        report = self.step_dir / REPORT_NAME
        if report.is_file():
            measured = measurement_from_report(json.loads(report.read_text()), load)
        else:
            measured = Measurement(load, problem=f"Locust exited {returncode} without a report: "
                                                 f"{log_error_line(self.log)}")
        problem = f"timed out after {self.timeout_s:g} s" if timed_out else measured.problem
        return replace(measured, report_dir=str(self.step_dir), returncode=returncode, problem=problem)

    def _run(self) -> tuple[int, bool]:
        child = Child(self.command, self.log, name=f"step {self.name}", env=dict(os.environ, PYTHONUNBUFFERED="1"),
                      stopping=Stopping(signal.SIGTERM, self.stop_grace_s, group=True))
        try:
            child.start()
            ended = child.wait(self.timeout_s, GAUGE_PERIOD_S, self.sample)
        finally:
            child.stop()  # at once after it ended; after the grace on a time-out or an interrupt
        return child.process.returncode, not ended


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
