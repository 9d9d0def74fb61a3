"""The fleet section of a report, from hand-built figures."""

from __future__ import annotations

import csv
import io

from hstu_replay.report.fleet_section import fleet_section, fleet_table, with_fleet_flags
from hstu_replay.report.html import render_html
from hstu_replay.report.summary import build_report
from hstu_replay.report.writers import FLEET_COLUMNS, fleet_csv
from hstu_replay.stats.run_stats import BinKey, RunStats

STAGE = BinKey(8, 0.5)
ADDRESSES = ("10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001")


def stats(loads, latencies_ms, errors=(0, 0, 0), down=(0.0, 0.0, 0.0), hits=(50, 50, 50)) -> RunStats:
    run = RunStats()
    whole = run.bin(STAGE)
    for i, (n, ms, e, d, h) in enumerate(zip(loads, latencies_ms, errors, down, hits)):
        b = run.server_bin(STAGE, i)
        for _ in range(n):
            for s in (b, whole):
                s.latency.record(ms / 1e3)
                s.requests += 1
                s.logical_requests += 8
                s.history_tokens += 100
                s.observed_tokens += 100
                s.observed_hits += h
                s.predicted_hits += h
                s.first_start, s.last_end = 0.0, 10.0
        b.errors, b.server_down_s = e, d
        whole.errors += e
    return run


def report(run: RunStats) -> dict:
    r = build_report(run, {"model": "m"})
    r["fleet"] = fleet_section(run, ADDRESSES, "key-hash")
    with_fleet_flags(r)
    return r


def test_each_servers_share_ratio_and_the_imbalance():
    r = report(stats((300, 200, 100), (10, 10, 10), hits=(50, 40, 0)))
    stage = r["fleet"]["stages"][0]
    rows = stage["servers"]
    assert [x["share"] for x in rows] == [0.5, 200 / 600, 100 / 600]
    assert [x["observed_ratio"] for x in rows] == [0.5, 0.4, 0.0]
    assert [x["throughput_rps"] for x in rows] == [30.0, 20.0, 10.0]
    assert stage["imbalance"] == 300 / 200 and stage["hottest"] == ADDRESSES[0]
    assert stage["flags"] == []


def test_a_server_failing_alone_is_the_hot_shard_and_its_stage_is_flagged():
    r = report(stats((100, 100, 100), (10, 10, 10), errors=(0, 7, 0)))
    (flag,) = r["fleet"]["stages"][0]["flags"]
    assert (flag["flag"], flag["server"]) == ("hot-shard", ADDRESSES[1]) and "failed 7 requests" in flag["reason"]
    assert "hot-shard" in r["bins"][0]["flags"] and r["stages"][0]["flags"][-1]["flag"] == "hot-shard"


def test_a_slow_server_is_the_hot_shard_only_when_its_p99_surely_is():
    slow = report(stats((200, 200, 200), (10, 10, 45)))
    assert [f["flag"] for f in slow["fleet"]["stages"][0]["flags"]] == ["hot-shard"]
    run = stats((200, 200, 200), (10, 10, 10))
    run.server_bin(STAGE, 2).latency.record(0.5)  # one slow request of 201: not a hot shard
    assert report(run)["fleet"]["stages"][0]["flags"] == []


def test_a_lost_server_is_named_and_not_also_the_hot_shard():
    r = report(stats((100, 100, 30), (10, 10, 10), errors=(0, 0, 25), down=(0.0, 0.0, 4.5)))
    (flag,) = r["fleet"]["stages"][0]["flags"]
    assert flag["flag"] == "server-lost" and "4.5 s" in flag["reason"] and flag["server"] == ADDRESSES[2]


def test_one_server_has_no_fleet_section():
    assert fleet_section(stats((10, 0, 0), (1, 1, 1)), ADDRESSES[:1], "key-hash") is None


def test_the_csv_terminal_and_page_show_every_server():
    r = report(stats((3, 2, 1), (10, 12, 14)))
    rows = list(csv.DictReader(io.StringIO(fleet_csv(r))))
    assert [row["server"] for row in rows] == list(ADDRESSES)
    assert set(FLEET_COLUMNS) <= set(rows[0]) and rows[0]["imbalance"] == "1.5"
    table = fleet_table(r)
    assert [row[2] for row in table[1:]] == [*ADDRESSES, "imbalance (busiest / mean)"]
    page = render_html(r)
    assert "Fleet: 3 servers, --routing key-hash" in page and all(a in page for a in ADDRESSES)
