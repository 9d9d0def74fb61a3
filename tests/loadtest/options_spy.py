"""A test instrument loaded beside locustfiles/hstu.py (`-f locustfiles/hstu.py,tests/loadtest/options_spy.py`):
at each test start it appends what this process's options and run config hold to the file named
by HSTU_OPTIONS_SPY, so a test can see what a worker received from its master."""

import json
import os

from locust import events


@events.test_start.add_listener
def _record(environment, **_):
    out = os.environ.get("HSTU_OPTIONS_SPY")
    run = getattr(getattr(environment, "hstu", None), "run", None)
    if out:
        with open(out, "a") as file:
            file.write(json.dumps({"options": vars(environment.parsed_options), "host": environment.host,
                                   "headers": run.prepared.config.target.headers if run else None}, default=str) + "\n")
