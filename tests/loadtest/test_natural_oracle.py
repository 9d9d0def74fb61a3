"""The cache curve is exact under every `--over-limit` policy: a natural replay against the oracle
server (tests/oracle/server.py, whose LRU shares no code with the ledger or the curve) finds exactly
the hit tokens the one-pass curve computes for the same requests at the oracle's budget."""

from __future__ import annotations

import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.loadtest.records import read_records
from hstu_replay.analysis.cache_curve import cache_curve
from hstu_replay.plan.over_limit import KINDS, HistoryPolicy, OverLimit
from hstu_replay.plan.timeline import build_trace, group_requests
from tests.conftest import run_locust

pytestmark = pytest.mark.integration

BUDGET = 2_080  # tokens (65 pages): a variant of the oracle no other test asks for; it evicts at --max-history 256
MAX_HISTORY = 256


@pytest.mark.parametrize("policy", list(OverLimit), ids=[p.value for p in OverLimit])
def test_the_oracles_hits_are_the_curves_under_each_policy(oracle_servers, long_store, tmp_path, policy):
    oracle = oracle_servers(cached_tokens=True, budget_tokens=BUDGET)
    start = len(oracle.records())
    # One virtual user: the requests reach the oracle in the trace's order (keys carry a run nonce, so
    # what earlier runs left in the shared oracle is older than, and evicted before, anything of this run).
    result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", oracle.grpc_url,
                        "--workload", "timeline", "--store", str(long_store), "--batch-sizes", "1",
                        "--arrival", "constant", "--request-rate", "80", "--stage-seconds", "5",
                        "--warmup-seconds", "0", "--max-history", str(MAX_HISTORY), "--verify-fraction", "0",
                        "--over-limit", policy.value, "--cache-budget-tokens", str(BUDGET))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = oracle.records()[start:]
    assert not [e["violations"] for e in seen if e["violations"]]
    assert len(seen) > 100, len(seen)

    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=MAX_HISTORY), 1,
                        HistoryPolicy(policy))
    n = len(seen)  # the run's first n requests, one visit each
    assert [e["totals"][0] for e in seen] == trace.tokens[:n].tolist()
    # one oracle key per (user, key epoch): a rebase starts a fresh key, nothing else does
    pairs = list(zip(trace.users[:n].tolist(), trace.epoch[:n].tolist()))
    key_of: dict[tuple, int] = {}
    for pair, entry in zip(pairs, seen):
        assert key_of.setdefault(pair, entry["keys"][0]) == entry["keys"][0]
    assert len(set(key_of.values())) == len(key_of)

    curve = cache_curve(trace.cache_keys[:n], trace.tokens[:n], group_requests(trace, 0, 1)[: n + 1])
    assert curve.exact_from_tokens <= BUDGET
    oracle_hits = sum(sum(e["hits"]) for e in seen)
    assert oracle_hits == curve.hit_tokens(BUDGET), (oracle_hits, curve.hit_tokens(BUDGET))
    assert 0.05 < curve.ratio(BUDGET) < curve.max_ratio  # the budget evicts: neither everything nor nothing hits

    kinds = [KINDS[k] for k in trace.kind[:n]]
    expected = {OverLimit.SKIP: "skipped", OverLimit.OLDEST: "frozen", OverLimit.REBASE: "rebased"}[policy]
    if policy is OverLimit.SKIP:
        assert len(trace.skipped_users) > 0 and not {"frozen", "rebased"} & set(kinds)
    else:
        assert expected in kinds and len(trace.skipped_users) == 0
    records = [r for r in read_records(tmp_path) if r["kind"] in ("measure", "warmup")]
    assert len(records) == n and sum(r["observed_hits"] for r in records) == oracle_hits
    assert result.report["natural"]["visit_kinds"]["over_limit"] == policy.value
    print(f"\n{policy.value}: {n} requests, oracle hits {oracle_hits:,} = curve at {BUDGET} tokens "
          f"(ratio {curve.ratio(BUDGET):.4f}, everything fits: {curve.max_ratio:.4f})")
