"""The load generator watching itself: how late its event loop runs and how busy its process is.

A greenlet ticks every TICK_S; how late each tick wakes is the loop's lag (the time a response
or a send waits for the loop). Every SAMPLE_S it reads the process's CPU time. Both land in the
stage being measured, so a stage whose client was the bottleneck is flagged (report.flags).
"""

from __future__ import annotations

import time

import gevent

TICK_S = 0.01
SAMPLE_S = 0.5


def watch_client(run) -> gevent.Greenlet:
    """Runs until the run ends (bounded by the run's life; killed at test stop at the latest)."""

    def loop() -> None:
        cpu, wall = time.process_time(), time.monotonic()
        tick = wall
        while not run.live.ended:
            gevent.sleep(TICK_S)
            now = time.monotonic()
            late, tick = max(now - tick - TICK_S, 0.0), now
            position = run.live.clock.position(now)
            measuring = position is not None and not position.warming_up
            if measuring:
                run.figures.stats.bin(position.stage.key).loop_lag.record(late)
            if now - wall >= SAMPLE_S:
                used, elapsed = time.process_time() - cpu, now - wall
                cpu, wall = cpu + used, now
                if measuring:
                    b = run.figures.stats.bin(position.stage.key)
                    b.client_cpu_s += used
                    b.client_wall_s += elapsed
                    b.client_cpu_peak = max(b.client_cpu_peak, used / elapsed)

    return gevent.spawn(loop)
