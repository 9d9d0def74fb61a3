"""A run's figures travel from its workers to the master as Locust's reports carry them: each
report holds what was counted since the last one, and the master's sums are the hand-added ones."""

from __future__ import annotations

import msgpack

from hstu_replay.loadtest.figures import RunFigures
from hstu_replay.loadtest.records import RequestRows
from hstu_replay.stats.run_stats import NATURAL, BinKey

B8_H05, B8_H1 = BinKey(8, 0.5), BinKey(8, 1.0)


def over_the_wire(data: dict) -> dict:
    return msgpack.loads(msgpack.dumps(data), raw=False)


def test_each_report_carries_what_was_counted_since_the_last_and_the_master_adds_them_up():
    worker, master = RunFigures(), RunFigures()
    worker.stats.bin(B8_H05).requests += 3
    worker.stats.bin(B8_H1).requests += 4
    worker.stats.warmup_requests += 2
    assert master.merge_worker_report(over_the_wire(worker.report_to_master())) == 3 + 4
    worker.stats.bin(B8_H05).requests += 5
    assert master.merge_worker_report(over_the_wire(worker.report_to_master())) == 5  # not 3 + 5 again
    assert master.merge_worker_report(over_the_wire(worker.report_to_master())) == 0
    assert master.stats.bin(B8_H05).requests == 8 and master.stats.bin(B8_H1).requests == 4
    assert master.stats.warmup_requests == 2
    assert master.merge_worker_report({"user_count": 4}) == 0  # a report without ours (a worker not yet running)


def test_a_natural_replays_rows_travel_with_its_statistics_and_others_carry_none():
    row = {"t": 1.7e9, "kind": "measure", "latency_ms": 12.5, "tokens": 300, "observed_hits": 120,
           "predicted_hits": 100, "ok": True, "label": "user 7 visit 1"}
    worker, master = RunFigures(RequestRows()), RunFigures(RequestRows())
    worker.rows.write(row)
    worker.stats.bin(BinKey(1, NATURAL)).requests += 1
    assert master.merge_worker_report(over_the_wire(worker.report_to_master())) == 1
    assert master.rows.records() == [row]
    assert worker.report_to_master()["hstu_rows"] == []
    assert "hstu_rows" not in RunFigures().report_to_master()
