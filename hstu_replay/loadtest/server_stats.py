"""Triton's own view of each stage: queue vs compute time from its statistics API (a fleet's summed),
and behind a gateway what each server's own KV-cache counters say of the stage (--fleet-metrics).

A greenlet on the master (or the single process) snapshots the model's cumulative statistics
when each stage's measured window opens and closes; the difference is that stage's split.
"""

from __future__ import annotations


import gevent

from hstu_replay.client.triton import TritonClient

POLL_S = 0.05
PHASES = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def _one(client: TritonClient, model: str) -> dict[str, tuple[int, int]] | None:
    stats = client.server_statistics(model)
    for entry in stats.get("model_stats", []):
        if entry.get("name") == model:
            inference = entry.get("inference_stats", {})
            return {p: (int(inference.get(p, {}).get("count", 0)), int(inference.get(p, {}).get("ns", 0)))
                    for p in PHASES}
    return None


def _snapshot(clients: list[TritonClient], model: str) -> dict[str, tuple[int, int]] | None:
    """The model's cumulative counts and times, summed over the fleet's servers (None where one
    does not say)."""
    each = [_one(c, model) for c in clients]
    if any(e is None for e in each):
        return None
    return {p: (sum(e[p][0] for e in each), sum(e[p][1] for e in each)) for p in PHASES}


def split(before: dict, after: dict) -> dict[str, float]:
    """Mean milliseconds per request of each phase between two snapshots."""
    out = {}
    for phase in PHASES:
        count = after[phase][0] - before[phase][0]
        ns = after[phase][1] - before[phase][1]
        out[f"{phase}_ms"] = ns / count / 1e6 if count else None
    out["count"] = after["success"][0] - before["success"][0]
    return out


def _backends(run):
    """Behind a gateway: the servers' own KV-cache counters (None without --fleet-metrics)."""
    urls = run.prepared.config.target.fleet_metrics
    if not urls:
        return None
    from hstu_replay.metrics.backends import BackendMetrics
    from hstu_replay.fleet.local import Backend

    return BackendMetrics([Backend("", "", None, url) for url in urls], run.prepared.config.target.model)


def watch(environment, run) -> None:
    model = run.prepared.config.target.model
    backends = _backends(run)
    target = run.prepared.config.target
    clients = [TritonClient(target.client_options(i)) for i in range(len(target.addresses))]
    pending: dict = {}  # the stage whose window is open, and the snapshot taken when it opened

    def close_window() -> None:
        if pending:
            after = _snapshot(clients, model)
            name = pending["stage"].key.name()
            if pending["before"] and after:
                run.figures.server_stages[name] = split(pending["before"], after)
            if backends is not None:
                run.figures.backend_stages[name] = backends.figures(pending["backends"], backends.snapshot())
            pending.clear()

    def follow():
        """Open a window when a stage's measured part begins, close it when that ends (polled:
        stages may end on a request count)."""
        clock, current = run.live.clock, None
        while not run.live.ended:  # bounded by the run (test_stop kills this greenlet at the latest)
            position = clock.position()
            measuring = position.stage if position is not None and not position.warming_up else None
            if current is not None and measuring is not current:
                close_window()
                current = None
            if measuring is not None and current is None:
                pending.update(stage=measuring, before=_snapshot(clients, model),
                               backends=backends.snapshot() if backends is not None else None)
                current = measuring
            if clock.started and position is None:
                return
            gevent.sleep(POLL_S)

    greenlet = gevent.spawn(follow)

    def stop(**_):
        greenlet.kill(block=True)
        close_window()  # a run stopped at (or before) the end of its last stage still gets its split
        for client in clients:
            client.close()
        environment.events.test_stop.remove_listener(stop)

    environment.events.test_stop.add_listener(stop)
