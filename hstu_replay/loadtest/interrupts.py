"""Ctrl-C and SIGTERM end a load-test process the way Locust ends a run: with its report, marked
interrupted when a run was still going (report.interruption), and `INTERRUPTED_EXIT_CODE`."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass

import gevent
from locust.runners import STATE_RUNNING, STATE_SPAWNING

from hstu_replay.loadtest.roles import Role
from hstu_replay.loadtest.schedule import SweepClock
from hstu_replay.report.interruption import interruption

INTERRUPTED_EXIT_CODE = 5  # a signal ended the run before its sweep did: it never passes


@dataclass(frozen=True)
class Interruption:
    """The signal that ended a run still going, when, and how far its sweep had got."""

    signal_name: str
    at_epoch: float
    at_s: float | None  # on the sweep's clock; None before the sweep started
    full: tuple[str, ...]
    partial: tuple[str, ...]
    not_run: tuple[str, ...]

    @classmethod
    def now(cls, signum: int, clock: SweepClock) -> Interruption:
        progress = clock.progress()
        names = (lambda stages: tuple(s.key.name() for s in stages))
        return cls(signal.Signals(signum).name, time.time(), clock.elapsed_s() if clock.started else None,
                   names(progress.full), names(progress.partial), names(progress.not_run))

    def section(self) -> dict:
        """report.json's `interrupted` section."""
        return interruption(self.signal_name, self.at_epoch, self.at_s, list(self.full), list(self.partial),
                            list(self.not_run))


def _note(environment, signum: int) -> None:
    """The run still going in this process (if any) was interrupted by `signum` (the first signal counts)."""
    runtime = getattr(environment, "hstu", None)
    run = None if runtime is None else runtime.run
    runner = environment.runner
    if run is None or run.live.ended or run.figures.interruption is not None or runner is None \
            or runner.state not in (STATE_SPAWNING, STATE_RUNNING):
        return
    run.figures.interruption = Interruption.now(signum, run.live.clock)


def install(environment, role: Role) -> None:
    """Ctrl-C raises KeyboardInterrupt in Locust's main greenlet, in every mode, where Locust
    catches it, stops the run and quits (the report is written at quitting). Python's own handler
    raises it in whichever greenlet happens to run (often a user's, which just dies) and leaves
    the process up. A headless master still waiting for --expect-workers (a wait Locust does not
    interrupt cleanly) tells the workers already connected to quit and exits 1: no run happened.
    Either signal arriving while a run goes is noted on the run first: its report says it was
    interrupted. Locust's --processes parent keeps its own handler."""
    if getattr(environment.parsed_options, "processes", None):
        return
    hub = gevent.get_hub()
    main = hub.parent  # the greenlet Locust's main() runs in

    def interrupt(signum: int = signal.SIGINT):
        if role.waiting_for_workers():
            print("hstu-replay: interrupted while waiting for workers; no run happened", file=sys.stderr, flush=True)
            environment.runner.quit()
            hub.loop.run_callback(main.throw, SystemExit(1))
        else:
            _note(environment, signum)
            hub.loop.run_callback(main.throw, KeyboardInterrupt)

    gevent.signal_handler(signal.SIGINT, interrupt)
    if environment.parsed_options.headless:
        # Locust installs its SIGTERM handler only once a headless run is over: until then a
        # SIGTERM (Kubernetes, docker stop) killed the process with no report. Take it as Ctrl-C
        # while the run goes; afterwards Locust's own handler acts alone.
        def terminate():
            if environment.runner is not None and environment.runner.state in (STATE_SPAWNING, STATE_RUNNING):
                interrupt(signal.SIGTERM)

        gevent.signal_handler(signal.SIGTERM, terminate)
    else:
        # Locust's own SIGTERM handler (installed after this one, so it runs second) shuts the
        # process down, writing the report: the run still going is noted as interrupted first.
        gevent.signal_handler(signal.SIGTERM, lambda: _note(environment, signal.SIGTERM))
