"""Triton's own view of each stage: queue vs compute time from its statistics API.

A greenlet on the master (or the single process) snapshots the model's cumulative statistics
when each stage's measured window opens and closes; the difference is that stage's split.
"""

from __future__ import annotations

import time

import gevent

from hstu_replay.client.triton import TritonClient

PHASES = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def _snapshot(client: TritonClient, model: str) -> dict[str, tuple[int, int]] | None:
    stats = client.server_statistics(model)
    for entry in stats.get("model_stats", []):
        if entry.get("name") == model:
            inference = entry.get("inference_stats", {})
            return {p: (int(inference.get(p, {}).get("count", 0)), int(inference.get(p, {}).get("ns", 0)))
                    for p in PHASES}
    return None


def split(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per request of each phase between two snapshots."""
    out = {}
    for phase in PHASES:
        count = after[phase][0] - before[phase][0]
        ns = after[phase][1] - before[phase][1]
        out[f"{phase}_ms"] = ns / count / 1e6 if count else None
    out["count"] = after["success"][0] - before["success"][0]
    return out


def watch(environment, run) -> None:
    model = run.config.triton_model
    client = TritonClient(run.config.client_options())
    pending: dict = {}  # the stage whose window is open, and the snapshot taken when it opened

    def close_window() -> None:
        if pending:
            after = _snapshot(client, model)
            if pending["before"] and after:
                run.server_stages[pending["stage"].key.name()] = split(pending["before"], after)
            pending.clear()

    def follow():
        clock = run.clock
        while not clock.started:  # ends with the run at the latest (test_stop kills this greenlet)
            gevent.sleep(0.05)
        for stage in clock.schedule.stages:
            gevent.sleep(max(0.0, clock.started_at + stage.start_s + stage.warmup_s - time.monotonic()))
            pending.update(stage=stage, before=_snapshot(client, model))
            gevent.sleep(max(0.0, clock.started_at + stage.end_s - time.monotonic()))
            close_window()

    greenlet = gevent.spawn(follow)

    def stop(**_):
        greenlet.kill(block=True)
        close_window()  # a run stopped at (or before) the end of its last stage still gets its split
        client.close()
        environment.events.test_stop.remove_listener(stop)

    environment.events.test_stop.add_listener(stop)
