"""Locust workers a request rate needs, on hand-worked numbers."""

from __future__ import annotations

import pytest

from hstu_replay.capacity.tables import worker_line
from hstu_replay.capacity.search import Measurement, Slo, judge, summarize
from hstu_replay.capacity.worker_count import WorkerPlan, plan_workers, workers_needed

SLO = Slo(p99_ms=100.0)


def test_workers_needed_is_the_cores_the_rate_keeps_busy_over_the_share_of_a_core():
    # 10,000 req/s x 0.42 ms = 4.2 cores; 4.2 / 0.7 = 6 workers exactly (6.000000000000001 in floats)
    assert workers_needed(10_000, 0.42, 0.7) == 6
    # 10,000 x 0.5 ms = 5 cores; 5 / 0.7 = 7.14: 8 workers
    assert workers_needed(10_000, 0.5, 0.7) == 8
    # 2,000 x 1 ms = 2 cores at a whole core each: 2; at half a core each: 4
    assert workers_needed(2_000, 1.0, 1.0) == 2 and workers_needed(2_000, 1.0, 0.5) == 4
    # 100 x 0.42 ms = 0.042 cores: still one worker
    assert workers_needed(100, 0.42, 0.7) == 1


def ratio_result(cpu_ms: float | None, rps: float = 36.0, batch: int = 8, client_bound: bool = False,
                 p99_ms: float = 80.0):
    step = Measurement(load=2, requests=360, throughput_rps=rps, logical_throughput=rps * batch, mean_ms=40.0,
                       p50_ms=40.0, p99_ms=p99_ms, error_ratio=0.0, client_cpu_ms_per_request=cpu_ms,
                       client_bound=client_bound)
    return summarize(0.5, [judge(step, SLO)], None)


def test_workers_for_a_target_in_logical_requests():
    # 2,000 logical/s at batch 8 = 250 requests/s; x 2 ms = 0.5 cores; / 0.7 = 0.71: 1 worker
    assert plan_workers(ratio_result(2.0), 8, 2000.0, 0.7) == WorkerPlan(250.0, "target", 2.0, 0.7, 1, False)
    # x 3 ms = 0.75 cores; / 0.7 = 1.07: 2 workers
    assert plan_workers(ratio_result(3.0), 8, 2000.0, 0.7).workers == 2


def test_workers_for_the_sustainable_rate_without_a_target():
    # 36 req/s x 25 ms = 0.9 cores; / 0.7 = 1.29: 2 workers; at a whole core each: 1
    plan = plan_workers(ratio_result(25.0, client_bound=True), 8, None, 0.7)
    assert plan == WorkerPlan(36.0, "sustainable", 25.0, 0.7, 2, True)
    assert plan_workers(ratio_result(25.0), 8, None, 1.0).workers == 1


def test_no_worker_figure_without_a_sustainable_step_or_a_measured_cpu():
    assert plan_workers(ratio_result(2.0, p99_ms=500.0), 8, 2000.0) is None  # the only step breached
    assert plan_workers(ratio_result(None), 8, 2000.0) is None
    assert plan_workers(ratio_result(0.0), 8, 2000.0) is None


def test_the_printed_line():
    data = {"target_rps": 80_000.0, "batch_size": 8}
    ratio = {"hit_ratio": 0.5, "workers": {"rate_rps": 10_000.0, "basis": "target", "cpu_ms_per_request": 0.42,
                                           "core_share": 0.7, "workers": 6, "client_bound": False}}
    assert worker_line(data, ratio) == ("workers needed for 10,000 req/s (target 80,000 logical/s) at b8 h0.50: 6 "
                                        "(client CPU 0.42 ms/request, 70% of a core per worker)")
    ratio["workers"].update(basis="sustainable", rate_rps=36.0, client_bound=True)
    assert worker_line(dict(data, target_rps=None), ratio) == (
        "workers needed for 36 req/s (one server's sustainable rate) at b8 h0.50: 6 "
        "(client CPU 0.42 ms/request, 70% of a core per worker; measured in a client-bound step)")
    assert worker_line(data, {"hit_ratio": 0.5, "workers": None}) is None


@pytest.mark.parametrize("share", ["0", "1.5", "x"])
def test_a_bad_share_of_a_core_is_one_line(share, capsys):
    from hstu_replay.cli import main

    code = main(["capacity", "run", "--store", "s", "--slo-p99-ms", "50", "--users-steps", "1",
                 "--worker-cpu-share", share])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--worker-cpu-share" in err[0], err
