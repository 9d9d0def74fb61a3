"""A working-set sweep under real Locust runs against the oracle server's two-tier variant: with the
GPU pool holding 8 keys and the host pool 20 (flexkv), N keys revisited round-robin are all GPU hits,
then all host hits, then all misses, by the oracle's own account of the measured requests, and the
report's tier figures are the oracle's."""

from __future__ import annotations

import pytest

from hstu_replay.loadtest.records import read_records
from tests.conftest import run_locust
from tests.loadtest.test_tiers import oracle_tiers
from tests.loadtest.test_truth import seen_since

pytestmark = pytest.mark.integration

T = 128  # --max-history 58: 6 + 2 * 58 = 122 tokens, 4 pages of 32
GPU, HOST = 8 * T, 20 * T


@pytest.mark.parametrize("size, tier", [(4, "gpu"), (12, "host"), (24, "miss")])
def test_a_working_set_past_each_budget_meets_the_hand_worked_tier(oracle_servers, sample_store, tmp_path, size,
                                                                   tier):
    oracle = oracle_servers(cached_tokens=True, budget_tokens=GPU, host_budget_tokens=HOST)
    start = len(oracle.records())
    result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", oracle.grpc_url, "--workload", "sessions",
                        "--store", str(sample_store), "--hit-ratios", "1", "--batch-sizes", "1,2",
                        "--stage-seconds", "3", "--warmup-seconds", "2", "--max-history", "58",
                        "--verify-fraction", "0", "--cache-budget-tokens", str(GPU), "--host-budget-tokens",
                        str(HOST), "--offload-mode", "flexkv", "--working-set", str(size))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = seen_since(oracle, start)
    assert not [e for e in seen if e["violations"]]
    assert {t for e in seen for t in e["totals"]} == {122}
    view = oracle_tiers(read_records(tmp_path), seen)
    for stage in result.report["stages"]:
        o, tiers = view[stage["name"]], stage["tiers"]
        users = o["gpu"] + o["host"] + o["miss"]
        assert users >= 2 * size and o[tier] == users, (stage["name"], o)  # at least two cycles measured
        assert tiers["source"] == "observed" and tiers["mix"][tier] == 1.0, tiers
        assert stage["hit_disagreements"] == 0, stage
        print(f"N={size} {stage['name']}: oracle {o}, reported mix {tiers['mix']}")
