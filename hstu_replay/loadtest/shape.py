"""Run the sweep for exactly its duration with the user count given by -u/-r (or the UI).

The sweep's clock starts once every user has spawned, so the run lasts the ramp-up plus the sweep.
"""

from __future__ import annotations

from locust import LoadTestShape


class SweepShape(LoadTestShape):
    use_common_options = True  # the web UI keeps its user count and spawn rate fields

    def tick(self):
        runtime = getattr(self.runner.environment, "hstu", None)
        if runtime is None:
            return None
        run = runtime.run  # until test start: none yet, or the previous run (ended)
        if run is not None and not run.live.ended and run.live.clock.over():
            return None
        options = self.runner.environment.parsed_options
        return options.num_users or 1, options.spawn_rate or 1
