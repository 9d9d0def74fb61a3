"""The truth table: every hit ratio the report prints equals what an independent server saw.

The oracle (tests/oracle/server.py) is a real Triton server whose KV-cache bookkeeping shares no
code with the tool's; it checks the wire layout of every request and records the hits each one
found. Each Locust run here is joined request by request with that record: per stage, the
reported achieved ratio must equal the oracle's within 0.005 and the target within
max(0.005, one page / mean history tokens), for closed and open loop, sessions and dumps, batch
1 and 8, one process and master + 2 workers, with and without CACHED_TOKENS, over gRPC and HTTP
(dump replay goes over HTTP: every byte layout the transports write is checked by the oracle).
"""

from __future__ import annotations

import json

import pytest

from hstu_replay.loadtest.records import read_records
from tests.conftest import run_distributed, run_locust
from tests.oracle.join import oracle_view

pytestmark = pytest.mark.integration

RATIOS = "0,0.5,0.9,1.0"
PAGE_TOKENS = 32


def sweep_args(server, workload: str, data: dict, arrival: str) -> list[str]:
    protocol = "http" if workload == "dumps" else "grpc"
    args = ["--triton-url", server.http_url if protocol == "http" else server.grpc_url, "--triton-protocol", protocol,
            "--workload", workload,
            "--store" if workload == "sessions" else "--dump-dir", str(data[workload]),
            "--hit-ratios", RATIOS, "--batch-sizes", "1,8", "--stage-seconds", "2", "--warmup-seconds", "0.5",
            "--max-history", "256", "--verify-fraction", "0"]  # the oracle answers zeros
    if arrival != "closed":
        args += ["--arrival", arrival, "--request-rate", "40"]
    return args


def check_truth(report: dict, records: list[dict], seen: list[dict], expect_source: str) -> list[str]:
    """Every stage: reported == oracle within 0.005, oracle == target within the page tolerance."""
    assert not [e for e in seen if e["violations"]], [e["violations"] for e in seen if e["violations"]][:3]
    view = oracle_view(records, seen)
    rows = []
    for stage in report["stages"]:
        hits, tokens = view[stage["name"]]
        oracle = hits / tokens
        tolerance = max(0.005, PAGE_TOKENS / stage["mean_history_tokens"])
        assert stage["requests"] >= 5, stage
        assert stage["hit_source"] == expect_source, stage
        assert abs(stage["achieved_ratio"] - oracle) <= 0.005, (stage, oracle)
        assert abs(oracle - stage["target_ratio"]) <= tolerance, (stage, oracle, tolerance)
        rows.append(f"{stage['name']}: target {stage['target_ratio']:g} reported {stage['achieved_ratio']:.4f} "
                    f"oracle {oracle:.4f} ({stage['requests']} requests)")
    return rows


def seen_since(oracle, start: int) -> list[dict]:
    return oracle.records()[start:]


@pytest.fixture(scope="module")
def data(sample_store, reference_dumps) -> dict:
    return {"sessions": sample_store, "dumps": reference_dumps}


@pytest.mark.parametrize("cached_tokens", [True, False], ids=["reports-hits", "no-hit-report"])
@pytest.mark.parametrize("workload", ["sessions", "dumps"])
@pytest.mark.parametrize("arrival", ["closed", "poisson"])
def test_one_process(oracle_servers, data, tmp_path, arrival, workload, cached_tokens):
    oracle = oracle_servers(cached_tokens=cached_tokens)
    start = len(oracle.records())
    result = run_locust(tmp_path, "-u", "4", "-r", "2", *sweep_args(oracle, workload, data, arrival))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = check_truth(result.report, read_records(tmp_path), seen_since(oracle, start),
                       "observed" if cached_tokens else "predicted")
    print(f"\n== truth: one process, {arrival}, {workload}, CACHED_TOKENS {'on' if cached_tokens else 'off'}")
    print("\n".join(rows))


@pytest.mark.parametrize("workload, arrival, cached_tokens", [
    ("sessions", "closed", False), ("sessions", "poisson", True),
    ("dumps", "closed", True), ("dumps", "poisson", False),
])
def test_master_and_two_workers(oracle_servers, data, tmp_path, workload, arrival, cached_tokens):
    oracle = oracle_servers(cached_tokens=cached_tokens)
    start = len(oracle.records())
    code, report_dir, log = run_distributed(tmp_path, *sweep_args(oracle, workload, data, arrival))
    assert code == 0, log[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    records = read_records(report_dir)
    assert {r["worker"] for r in records} == {0, 1}
    rows = check_truth(report, records, seen_since(oracle, start), "observed" if cached_tokens else "predicted")
    print(f"\n== truth: master + 2 workers, {arrival}, {workload}, CACHED_TOKENS {'on' if cached_tokens else 'off'}")
    print("\n".join(rows))


def test_the_capacity_model_agrees_with_an_independent_lru(oracle_servers, data, tmp_path):
    """Under a cache budget the client's model must predict the evictions an independent LRU makes."""
    budget = 48 * PAGE_TOKENS  # below the working set at batch 8 (2 users x 8 keys)
    oracle = oracle_servers(cached_tokens=False, budget_tokens=budget)
    start = len(oracle.records())
    result = run_locust(tmp_path, "-u", "2", "-r", "2", *sweep_args(oracle, "sessions", data, "closed"),
                        "--cache-budget-tokens", str(budget))
    assert result.returncode == 0, result.stderr[-3000:]
    view = oracle_view(read_records(tmp_path), seen_since(oracle, start))
    evicting = 0
    for stage in result.report["stages"]:
        hits, tokens = view[stage["name"]]
        assert abs(stage["achieved_ratio"] - hits / tokens) <= 0.005, (stage, hits / tokens)
        evicting += stage["target_ratio"] - hits / tokens > 0.01
        print(f"{stage['name']}: target {stage['target_ratio']:g} reported {stage['achieved_ratio']:.4f} "
              f"oracle {hits / tokens:.4f} (LRU budget {budget} tokens)")
    assert evicting  # the budget was small enough to matter


def test_batch_8_at_default_options(oracle_servers, full_length_store, tmp_path):
    """Default --max-history 4096 and --max-values 40000 with users longer than both allow at
    batch 8: histories are capped to fit, the oracle sees every request within the published
    limits, and reported equals seen."""
    oracle = oracle_servers(cached_tokens=False)
    start = len(oracle.records())
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", oracle.grpc_url, "--workload", "sessions",
                        "--store", str(full_length_store), "--hit-ratios", RATIOS, "--batch-sizes", "8",
                        "--stage-seconds", "3", "--warmup-seconds", "0.5", "--verify-fraction", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "batch 8: histories capped at 2481 items" in result.stderr
    seen = seen_since(oracle, start)
    assert max(len(e["keys"]) for e in seen) == 8
    assert max(max(e["totals"]) for e in seen) > 2 * 2000  # long histories were sent
    rows = check_truth(result.report, read_records(tmp_path), seen, "predicted")
    print("\n== truth: one process, closed, sessions, batch 8 at default options")
    print("\n".join(rows))
