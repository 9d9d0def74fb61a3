"""The master's merged percentiles equal those of every process's records laid end to end.

Three processes file hand-made requests through the real accountant (records on disk, stats in
memory), hand their stats over in periodic reports as Locust workers do (JSON round trip), and a
master merges them. The report built from the merge is checked against the records files alone:
the histogram rebuilt from the records' `latency_ms` must be the merged one exactly, and each
percentile must lie in the bucket of the nearest-rank value of the sorted latencies (computed
here with integer arithmetic), within the histogram's documented 0.1%.
"""

from __future__ import annotations

import itertools
import json
import random
from fractions import Fraction

import numpy as np
import orjson

from hstu_replay.loadtest.records import RecordWriter, read_records
from hstu_replay.report.summary import build_report
from hstu_replay.request import RequestTensors
from hstu_replay.stats.accounting import Accountant, Outcome, Sent
from hstu_replay.stats.histogram import LatencyHistogram, bucket_bounds, bucket_of
from hstu_replay.stats.run_stats import BinKey, RunStats

STAGES = (BinKey(2, 0.0), BinKey(2, 0.5))
#: percentile -> the same as an exact fraction, for the independent nearest rank
QUANTILES = {"p50_ms": Fraction(50, 100), "p90_ms": Fraction(90, 100), "p99_ms": Fraction(99, 100),
             "p999_ms": Fraction(999, 1000)}
#: latencies whose microseconds sit on a rounding tie (x.5 us): seconds x 1e6 and the milliseconds
#: of the records file x 1e3 round them differently unless both go through the same figure
TIES_S = (0.0116035, 0.0021005, 0.0449995, 0.0010005)


def request(batch: int = 2) -> RequestTensors:
    lengths = np.full(batch, 3, dtype=np.int64)
    return RequestTensors.of(np.arange(3 * batch, dtype=np.int64), lengths, np.ones(batch, dtype=np.int64),
                             np.arange(batch, dtype=np.int64), lengths.copy())


def latencies(seed: int, n: int, median_s: float) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(np.log(median_s), 0.8) for _ in range(n)]


def file(acc: Accountant, kind: str, stage: BinKey, latency_s: float, error: str = "") -> None:
    acc.file(Sent(kind, stage, request(), (0, 0), (0, 0), Outcome(latency_s, error=error), "x", 0))


def run_process(index: int, tmp_path, sizes: tuple[int, int]) -> list[RunStats]:
    """One load-generating process: its records file, and the stats it reported, one report per
    half of its requests (a worker reports every few seconds and starts afresh)."""
    stats = RunStats()
    writer = RecordWriter(tmp_path, f"w{index}")
    acc = Accountant(stats, writer, worker_index=index)
    reports = []
    for stage, n, median in zip(STAGES, sizes, (0.004, 0.0015)):
        values = latencies(100 * index + stage.batch_size + int(stage.goal_ratio * 10), n, median)
        values += TIES_S if index == 1 else ()
        file(acc, "warmup", stage, 0.5)  # warm-up, primes and failures are not measured latencies
        file(acc, "prime", stage, 0.7)
        file(acc, "measure", stage, 0.9, error="timeout")
        for i, v in enumerate(values):
            file(acc, "measure", stage, v)
            if i == n // 2:
                reports.append(stats.take())
    reports.append(stats.take())
    writer.close()
    return [RunStats.from_dict(json.loads(orjson.dumps(r.to_dict()))) for r in reports]


def merged(reports: list[RunStats]) -> RunStats:
    master = RunStats()
    for r in reports:
        master.merge(r)
    return master


def nearest_rank_value(sorted_values: list[float], q: Fraction) -> float:
    """The ceil(q x n)-th smallest value (1-based), in integer arithmetic."""
    n = len(sorted_values)
    rank = max(1, -(-q.numerator * n // q.denominator))
    return sorted_values[rank - 1]


def measured_ms(records: list[dict], stage: BinKey) -> list[float]:
    return [r["latency_ms"] for r in records if r["kind"] == "measure" and r["ok"] and r["stage"] == stage.name()]


def test_merged_report_percentiles_equal_those_of_the_concatenated_records(tmp_path):
    # 1000 measured requests in all at the first stage: p99.9 is the 999th value, not the max
    sizes = {0: (400, 150), 1: (300 - len(TIES_S), 97), 2: (300, 61)}
    reports = {i: run_process(i, tmp_path, s) for i, s in sizes.items()}
    master = merged([r for i in sorted(reports) for r in reports[i]])
    report = json.loads(json.dumps(build_report(master, run={})))
    records = read_records(tmp_path)
    assert {r["worker"] for r in records} == {0, 1, 2}
    bins = {b["name"]: b for b in report["bins"]}
    for stage in STAGES:
        ms = measured_ms(records, stage)
        rebuilt = LatencyHistogram.of_ms(ms)
        assert rebuilt == master.bins[stage].latency  # counts, total, sum and max: exactly
        b = bins[stage.name()]
        assert b["requests"] == len(ms) and b["errors"] == len(sizes)
        ordered = sorted(ms)
        assert b["max_ms"] == round(ordered[-1] * 1e3) / 1e3
        for key, q in QUANTILES.items():
            assert b[key] == rebuilt.percentile_ms(float(q * 100)), key
            exact = nearest_rank_value(ordered, q)
            low, high = bucket_bounds(bucket_of(round(exact * 1e3)))
            assert low <= b[key] * 1e3 < high, (stage, key, exact, b[key])
            # 0.1% of the value, plus the half microsecond the histogram rounds every value by
            assert abs(b[key] - exact) <= exact / 1000 + 0.0005, (stage, key, exact, b[key])
    assert len(measured_ms(records, STAGES[0])) == 1000
    assert bins[STAGES[0].name()]["p999_ms"] < bins[STAGES[0].name()]["max_ms"]


def test_merging_is_order_independent_and_equals_one_histogram_of_every_sample():
    parts = [latencies(seed, n, median) for seed, n, median in ((1, 200, 0.003), (2, 50, 0.03), (3, 120, 0.0008))]
    parts[1] += list(TIES_S)
    whole = LatencyHistogram.of(v for part in parts for v in part)
    for order in itertools.permutations(range(len(parts))):
        h = LatencyHistogram()
        for i in order:
            h.merge(LatencyHistogram.from_dict(json.loads(json.dumps(LatencyHistogram.of(parts[i]).to_dict()))))
        assert h == whole, order
        assert [h.percentile_ms(q) for q in (50, 90, 99, 99.9)] == [whole.percentile_ms(q) for q in (50, 90, 99, 99.9)]


def test_a_latency_on_a_rounding_tie_lands_where_its_record_says():
    # 0.0116035 s x 1e6 rounds to 11604 us, its milliseconds 11.6035 (as a records file holds
    # them) x 1e3 to 11603 us: the histogram takes the records' figure, so both agree.
    for s in TIES_S:
        ms = orjson.loads(orjson.dumps(s * 1e3))
        assert LatencyHistogram.of([s]) == LatencyHistogram.of_ms([ms]), s
    assert LatencyHistogram.of([0.0116035]).max_us == 11603


def test_the_nearest_rank_of_a_decimal_percentile_is_not_thrown_off_by_float_rounding():
    # 1..1000 us: p99.9 is the 999th value; 99.9 / 100 x 1000 = 999.0000000000001 in floats
    h = LatencyHistogram.of_ms(i / 1e3 for i in range(1, 1001))
    assert h.percentile_ms(99.9) == 0.999
    assert h.percentile_ms(99) == 0.990 and h.percentile_ms(50) == 0.500 and h.percentile_ms(100) == 1.0
