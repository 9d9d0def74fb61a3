"""Ctrl-C and SIGTERM end a load-test process the way Locust ends a run: with its report."""

from __future__ import annotations

import signal
import sys

import gevent
from locust.runners import STATE_RUNNING, STATE_SPAWNING

from hstu_replay.loadtest.roles import Role


def install(environment, role: Role) -> None:
    """Ctrl-C raises KeyboardInterrupt in Locust's main greenlet, in every mode, where Locust
    catches it, stops the run and quits (the report is written at quitting). Python's own handler
    raises it in whichever greenlet happens to run (often a user's, which just dies) and leaves
    the process up. A headless master still waiting for --expect-workers (a wait Locust does not
    interrupt cleanly) tells the workers already connected to quit and exits 1: no run happened.
    Locust's --processes parent keeps its own handler."""
    if getattr(environment.parsed_options, "processes", None):
        return
    hub = gevent.get_hub()
    main = hub.parent  # the greenlet Locust's main() runs in

    def interrupt():
        if role.waiting_for_workers():
            print("hstu-replay: interrupted while waiting for workers; no run happened", file=sys.stderr, flush=True)
            environment.runner.quit()
            hub.loop.run_callback(main.throw, SystemExit(1))
        else:
            hub.loop.run_callback(main.throw, KeyboardInterrupt)

    gevent.signal_handler(signal.SIGINT, interrupt)
    if environment.parsed_options.headless:
        # Locust installs its SIGTERM handler only once a headless run is over: until then a
        # SIGTERM (Kubernetes, docker stop) killed the process with no report. Take it as Ctrl-C
        # while the run goes; afterwards Locust's own handler acts alone.
        def terminate():
            if environment.runner is not None and environment.runner.state in (STATE_SPAWNING, STATE_RUNNING):
                interrupt()

        gevent.signal_handler(signal.SIGTERM, terminate)
