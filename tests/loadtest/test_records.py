"""A natural replay's request rows: the report built from what the run accounted (merged from
its workers like the other statistics) is the one the records files give."""

from __future__ import annotations

import random

import msgpack
import numpy as np

from hstu_replay.loadtest.records import RecordWriter, RequestRows, read_records
from hstu_replay.report.natural import natural_section, write_natural_csv


def record(rng: random.Random, t: float) -> dict:
    tokens = rng.randrange(50, 500)
    observed = rng.choice([None, rng.randrange(0, tokens)])
    return {"t": t, "latency_ms": rng.uniform(1, 40), "kind": rng.choice(["measure", "measure", "warmup", "prime"]),
            "stage": "b1_natural", "batch": 1, "target": float("nan"), "tokens": tokens, "keys": [7],
            "expected_hits": 0, "predicted_hits": np.int64(rng.randrange(0, tokens)), "observed_hits": observed,
            "ok": rng.random() > 0.1, "error": None, "label": f"user {rng.randrange(99)} visit 1", "worker": 0,
            "user": 0}


def test_rows_merged_from_workers_give_the_records_files_report(tmp_path):
    rng = random.Random(3)
    workers = [RequestRows(RecordWriter(tmp_path / "records", f"worker{i}")) for i in range(2)]
    master = RequestRows()
    for n in range(400):
        worker = workers[n % 2]
        worker.write(record(rng, 1.7e9 + n * 0.01 + rng.random() * 0.005))
        if n % 37 == 0:  # a Locust report: over the wire as the master receives it
            master.merge(msgpack.loads(msgpack.dumps(worker.take()), raw=False))
    for worker in workers:
        master.merge(msgpack.loads(msgpack.dumps(worker.take()), raw=False))
        worker.sink.close()

    from_files = read_records(tmp_path / "records")
    assert len(master.rows) == len(from_files) == 400
    assert natural_section(master.records()) == natural_section(from_files)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert (write_natural_csv(master.records(), tmp_path / "a").read_text()
            == write_natural_csv(from_files, tmp_path / "b").read_text())


def test_a_take_hands_over_each_row_once(tmp_path):
    rows = RequestRows()
    rows.write(record(random.Random(1), 1.0))
    assert len(rows.take()) == 1 and rows.take() == []


def test_a_natural_stage_merges_into_one_bin_over_the_wire():
    from hstu_replay.stats.run_stats import NATURAL, BinKey, RunStats

    master, worker = RunStats(), RunStats()
    worker.bin(BinKey(1, NATURAL)).requests = 3
    for _ in range(2):
        master.merge(RunStats.from_dict(msgpack.loads(msgpack.dumps(worker.to_dict()), raw=False)))
    assert [b.requests for b in master.bins.values()] == [6]
