"""Processes a distributed run loses on the way, seen from both ends.

- A worker watches its master's heartbeat (`watch_master`): silent for --master-timeout seconds,
  the worker stops its users, says so in one line and exits with `LOST_EXIT_CODE` (Locust's own
  check waits a fixed 60 s, then exits 0, while the users go on sending).
- A master keeps an account of its workers (`WorkerAccount`): one that Locust marks missing, or
  that quits while the run goes, is lost: when, in which stage, with how many users, and how
  many of its measured requests never arrived (its records file says how many it sent). A
  headless master that has lost every worker ends the run with its report and `LOST_EXIT_CODE`.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import gevent
import orjson

from hstu_replay.report.worker_events import joined, loss

LOST_EXIT_CODE = 4  # the run lost its master (at a worker) or every worker (at a master)
CHECK_INTERVAL_S = 0.25
RESUME_GRACE_S = 2.0  # after its own loop stalled, a worker reads queued heartbeats (one comes each second)
DEFAULT_MASTER_TIMEOUT_S = 5.0


def _states() -> tuple[tuple[str, ...], str]:
    """Locust's runner states (a run going, a worker missing), read at run time: importing locust
    patches the importing process with gevent, which a module imported by tests must not do."""
    from locust.runners import STATE_MISSING, STATE_RUNNING, STATE_SPAWNING

    return (STATE_SPAWNING, STATE_RUNNING), STATE_MISSING


def _say(message: str) -> None:
    print(f"hstu-replay: {message}", file=sys.stderr, flush=True)


def master_timeout(options) -> float:
    """--master-timeout as the worker has it now (its master's value once a run started)."""
    try:
        value = float(getattr(options, "master_timeout", DEFAULT_MASTER_TIMEOUT_S))
    except (TypeError, ValueError):
        return DEFAULT_MASTER_TIMEOUT_S
    return value if value > 0 else DEFAULT_MASTER_TIMEOUT_S


def watch_master(environment) -> gevent.Greenlet:
    """At a worker: a greenlet that ends the process once its master has been silent longer than
    --master-timeout (armed by the master's first heartbeat; bounded by that timeout plus one
    check interval, or RESUME_GRACE_S after a stall of this process's own loop)."""
    runner = environment.runner

    def watch():
        awake = Stall()
        while True:
            gevent.sleep(CHECK_INTERVAL_S)
            awake.check()
            timeout = master_timeout(environment.parsed_options)
            last = runner.last_heartbeat_timestamp
            now = time.time()
            if last is not None and now - last > timeout and now - awake.busy_until > RESUME_GRACE_S:
                return master_lost(environment, now - last, timeout)

    return gevent.spawn(watch)


class Stall:
    """When this process's own work last held its event loop (preparing a run, a slow callback):
    the master's heartbeats then wait unread, so its silence is not the master's. A process that
    was not running at all (stopped, its machine suspended) used no CPU meanwhile: the master's
    silence then counts, as after a cut network."""

    def __init__(self):
        self.wall, self.cpu = time.time(), time.process_time()
        self.busy_until = 0.0

    def check(self) -> None:
        wall, cpu = time.time(), time.process_time()
        gap = wall - self.wall
        if gap > CHECK_INTERVAL_S + 0.5 and cpu - self.cpu >= gap / 2:
            self.busy_until = wall
        self.wall, self.cpu = wall, cpu


def master_lost(environment, silent_s: float, timeout_s: float) -> None:
    runner, run = environment.runner, environment.hstu.run
    records = run.live.records.path if run is not None and run.live.records is not None else None
    _say(f"error: no heartbeat from the master for {silent_s:.1f} s (--master-timeout {timeout_s:g}): stopping "
         f"{runner.user_count} users and exiting" + (f"; records kept in {records}" if records else ""))
    environment.process_exit_code = LOST_EXIT_CODE
    runner.quit()  # users stop, then the process ends (its records file is closed at quitting)


class WorkerAccount:
    """At a master: which workers ran in this run, what each last held and sent, which were lost
    or joined late. `check` looks at Locust's view of its workers (a greenlet does it every
    CHECK_INTERVAL_S, and the report does it once more before it is written)."""

    def __init__(self, environment):
        self.environment = environment
        self.reset()

    def reset(self) -> None:
        """At each test start."""
        self.last_seen: dict[str, float] = {}  # client id -> wall time of its last heartbeat
        self.users: dict[str, int] = {}  # client id -> users in its last report
        self.received: dict[str, int] = {}  # client id -> measured requests merged from it
        self.running: set[str] = set()  # workers that ran in this run, not lost
        self.lost: set[str] = set()
        self.losses: list[tuple[str, float]] = []  # (client id, wall time last seen), in order
        self.joins: list[dict] = []
        self.ended_run = False

    def install(self) -> None:
        events = self.environment.events
        events.heartbeat_sent.add_listener(lambda client_id, timestamp, **_: self.last_seen.update({client_id: timestamp}))
        events.worker_connect.add_listener(lambda client_id, **_: self._connected(client_id))
        gevent.spawn(self._watch)

    def reported(self, client_id: str, data: dict, measured: int) -> None:
        """A worker's statistics arrived (`measured`: the measured requests they carry)."""
        self.users[client_id] = int(data.get("user_count", self.users.get(client_id, 0)))
        self.received[client_id] = self.received.get(client_id, 0) + measured

    @property
    def _run(self):
        return self.environment.hstu.run

    def _connected(self, client_id: str) -> None:
        run, runner = self._run, self.environment.runner
        if run is None or not run.live.clock.started or run.live.ended or runner.state not in _states()[0]:
            return
        if client_id not in self.running and all(j["client_id"] != client_id for j in self.joins):
            at_s = self._run_clock(time.time())
            self.joins.append(joined(runner.get_worker_index(client_id), client_id, at_s, self._stage_at(at_s)))

    def _watch(self) -> None:
        while True:
            gevent.sleep(CHECK_INTERVAL_S)
            self.check()

    def check(self) -> None:
        runner = self.environment.runner
        if self._run is None:
            return
        running_states, missing = _states()
        going = runner.state in running_states
        for client_id, node in list(runner.clients.items()):
            if going and node.state in running_states and client_id not in self.lost:
                self.running.add(client_id)
        for client_id in sorted(self.running):
            node = runner.clients.get(client_id)
            if (node is not None and node.state == missing) or (node is None and going):
                self.running.discard(client_id)
                self.lost.add(client_id)
                self.losses.append((client_id, self.last_seen.get(client_id, math.nan)))
                _say(f"warning: lost worker {runner.get_worker_index(client_id)} ({client_id})")
        if self.losses and not self.running and runner.worker_count == 0 and not self.ended_run:
            self._end_run()

    def _end_run(self) -> None:
        """Every worker is gone: a headless run ends now, with its report and LOST_EXIT_CODE."""
        self.ended_run = True
        options = self.environment.parsed_options
        if not getattr(options, "headless", False):
            return
        _say("error: every worker was lost: the run ends here")
        self.environment.process_exit_code = LOST_EXIT_CODE
        gevent.spawn_later(1.0, self.environment.runner.quit)  # unless Locust's own end comes first

    def _run_clock(self, wall: float) -> float | None:
        started = self._run.live.clock.started_epoch
        return None if math.isnan(started) or math.isnan(wall) else max(wall - started, 0.0)

    def _stage_at(self, at_s: float | None) -> str | None:
        position = None if at_s is None else self._run.prepared.schedule.at(at_s)
        return None if position is None else position.stage.key.name()

    def story(self) -> tuple[list[dict], list[dict]]:
        """report.json's "workers_lost" and "workers_joined" as things stand."""
        self.check()
        run, runner = self._run, self.environment.runner
        stages = run.prepared.schedule.stages
        users_before, report_dir = run.figures.users, Path(run.prepared.config.report.report_dir)
        out = []
        for client_id, seen in self.losses:
            at_s = self._run_clock(seen)
            index = runner.get_worker_index(client_id)
            held = self.users.get(client_id, 0)
            out.append(loss(index, client_id, at_s, self._stage_at(at_s), held, users_before,
                            [s.key.name() for s in stages if at_s is None or s.end_s > at_s],
                            measured_sent(report_dir, index, run.live.clock.started_epoch),
                            self.received.get(client_id, 0)))
            users_before = max(users_before - held, 0)
        return out, list(self.joins)


def measured_sent(report_dir: Path, index: int, since_epoch: float) -> int | None:
    """The measured requests answered that worker `index`'s records file of this run holds; None
    when there is none to read here (a worker on another machine, or another --report-dir)."""
    paths = [p for p in report_dir.glob(f"records-worker{index}-*.jsonl")
             if math.isnan(since_epoch) or p.stat().st_mtime >= since_epoch]
    if not paths:
        return None
    count = 0
    for path in paths:
        for line in path.read_bytes().splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a torn last line (killed mid-write)
            count += record.get("kind") == "measure" and bool(record.get("ok"))
    return count
