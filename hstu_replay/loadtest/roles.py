"""The three parts a Locust process can play in a run, one class each, as Locust's own runners
are (LocalRunner, MasterRunner, WorkerRunner). `role_for` picks one from the runner, once.

- `LocalRole`: one process does everything.
- `MasterRole`: spawns nothing itself; tells its workers the sweep's clock, merges their
  statistics, keeps an account of workers lost or joined, writes the report and follows the
  server's statistics.
- `WorkerRole`: replays users and writes records; its statistics go to the master, and a
  failure to prepare is reported there; a silent master makes it stop (loadtest.faults).
"""

from __future__ import annotations

import sys
from typing import ClassVar

import gevent

WORKER_FAILED = "hstu_worker_failed"  # worker -> master: preparing the run failed
WORKER_STOPPED = "hstu_worker_stopped"  # worker -> master: the run must stop (a limit the server refused)
#: the server refused a request for a limit it had not published: the run stopped at the first such refusal
LIMIT_EXIT_CODE = 6
SWEEP_CLOCK = "hstu_sweep_clock"  # master -> workers: seconds since the sweep started


def fail(environment, message: str, code: int = 2) -> None:
    """One line for the user, then stop the run with a non-zero exit code."""
    print(f"hstu-replay: error: {message}", file=sys.stderr, flush=True)
    environment.process_exit_code = code
    if environment.runner is not None:
        gevent.spawn_later(0, environment.runner.quit)


class Role:
    name: ClassVar[str]
    replays: ClassVar[bool] = True  # runs virtual users: opens the data, writes records, watches its own loop
    reports: ClassVar[bool] = True  # writes the report and follows the server's statistics
    ends_stages_on_count: ClassVar[bool] = False  # --stage-requests applies (one process only)
    reads_own_options: ClassVar[bool] = True  # at init (a worker's come from its master at each test start)

    def __init__(self, environment=None):
        self.environment = environment
        self.worker_index = 0
        self.worker_count = 1

    @property
    def runner(self):
        return self.environment.runner

    def install(self, runtime) -> None:
        """At init: the messages this role exchanges."""

    def test_starting(self, options) -> None:
        """At each test start, before the run is prepared."""

    def failed_to_prepare(self, message: str) -> None:
        """The run could not be prepared (the process stops itself)."""

    def sweep_started(self, run) -> None:
        """Every user has spawned and the sweep's clock runs."""

    def stop_run(self, message: str) -> None:
        """The whole run stops for `message` (one line), its report still written (exit `LIMIT_EXIT_CODE`)."""
        fail(self.environment, message, LIMIT_EXIT_CODE)

    def stop_running(self) -> None:
        """Quitting while the run goes (Ctrl-C): its users end before the report is written."""
        self.runner.stop()

    def waiting_for_workers(self) -> bool:
        """Whether a headless start still waits for its workers (nothing ran yet)."""
        return False

    def worker_reported(self, client_id: str, data: dict, measured: int) -> None:
        """A worker's statistics arrived at the master (`measured`: its measured requests in them)."""

    def workers_story(self) -> tuple[list[dict], list[dict]] | None:
        """The workers lost and joined during the run (report.worker_events); None outside a master."""
        return None


class LocalRole(Role):
    name = "local"
    ends_stages_on_count = True


class MasterRole(Role):
    name = "master"
    replays = False

    def __init__(self, environment=None):
        super().__init__(environment)
        self.workers = None  # the account of its workers, once installed on Locust's master runner

    def install(self, runtime) -> None:
        from hstu_replay.loadtest.faults import WorkerAccount

        self.runner.register_message(WORKER_FAILED, lambda msg, **_: fail(self.environment, f"worker {msg.data}"))
        self.runner.register_message(WORKER_STOPPED, lambda msg, **_: runtime.stop_run(f"worker {msg.data}"))
        self.workers = WorkerAccount(self.environment)
        self.workers.install()

    def test_starting(self, options) -> None:
        # Custom attributes of parsed_options travel to the workers with the spawn message.
        options.hstu_worker_count = max(self.runner.worker_count, 1)
        options.hstu_total_users = options.num_users
        self.worker_count = options.hstu_worker_count
        self.workers.reset()

    def worker_reported(self, client_id: str, data: dict, measured: int) -> None:
        self.workers.reported(client_id, data, measured)

    def workers_story(self) -> tuple[list[dict], list[dict]]:
        # a master without Locust's runner (the bookkeeping benchmark's) has no workers to account for
        return self.workers.story() if self.workers is not None else ([], [])

    def sweep_started(self, run) -> None:
        self.runner.send_message(SWEEP_CLOCK, run.live.clock.elapsed_s())  # workers that join late get it too

    def waiting_for_workers(self) -> bool:
        from locust.runners import STATE_INIT

        return self.runner.state == STATE_INIT and bool(self.environment.parsed_options.headless)


class WorkerRole(Role):
    name = "worker"
    reports = False
    reads_own_options = False

    def install(self, runtime) -> None:
        from hstu_replay.loadtest.faults import watch_master

        def sweep_clock(msg, **_):
            if runtime.run is not None:
                runtime.run.live.clock.start(elapsed_s=float(msg.data))

        self.runner.register_message(SWEEP_CLOCK, sweep_clock)
        watch_master(self.environment)  # a silent master stops this worker within --master-timeout

    def test_starting(self, options) -> None:
        self.worker_index = self.runner.worker_index
        self.worker_count = int(getattr(options, "hstu_worker_count", 1))

    def failed_to_prepare(self, message: str) -> None:
        self.runner.send_message(WORKER_FAILED, f"{self.worker_index}: {message}")

    def stop_run(self, message: str) -> None:
        print(f"hstu-replay: error: {message}", file=sys.stderr, flush=True)
        self.runner.send_message(WORKER_STOPPED, f"{self.worker_index}: {message}")  # the master stops every worker

    def stop_running(self) -> None:
        # a worker quitting on its own also sends its last statistics, which Locust sends only
        # when the master asks it to quit (else the master's report misses up to 3 s of them)
        self.runner.stop()
        self.runner._send_stats()


def role_for(environment) -> Role:
    """The role of the process whose environment this is (Locust's runner class says it)."""
    from locust.runners import MasterRunner, WorkerRunner

    runner = environment.runner
    if isinstance(runner, MasterRunner):
        return MasterRole(environment)
    if isinstance(runner, WorkerRunner):
        return WorkerRole(environment)
    return LocalRole(environment)
