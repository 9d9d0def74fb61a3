"""`hstu-replay plan cache-curve`: files written, figures consistent with the ledger (the chart too), bad input one line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.timeline import build_trace

SVG = "{http://www.w3.org/2000/svg}"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hstu_replay.cli", *args], capture_output=True, text=True)


def test_the_curve_of_a_store_matches_its_replay_through_the_ledger(long_store, tmp_path):
    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--max-history", "256",
                "--budgets", "2000,5000,20000", "--out", str(tmp_path / "curve"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "curve" / "curve.json").read_text())
    rows = list(csv.DictReader((tmp_path / "curve" / "curve.csv").open()))
    chart = ET.parse(tmp_path / "curve" / "curve.svg").getroot()  # well-formed XML, or this raises
    marked = [(int(c.get("data-budget")), float(c.get("data-ratio"))) for c in chart.iter(f"{SVG}circle")]
    assert marked == [(b["budget_tokens"], b["hit_ratio"]) for b in summary["budgets"]]
    assert chart.find(f".//{SVG}polyline[@data-metric='hit_ratio']") is not None
    assert [b["budget_tokens"] for b in summary["budgets"]] == [2000, 5000, 20000]
    # The same trace replayed request by request through the target's own ledger.
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    tokens = trace.tokens
    for b in summary["budgets"]:
        ledger = CacheLedger(b["budget_tokens"], 32)
        hits = sum(ledger.serve([(int(u), int(t))]).hits[0] for u, t in zip(trace.users, tokens))
        assert b["hit_ratio"] == hits / int(tokens.sum()), b
        assert f"{b['budget_tokens']:>14,} tokens: hit ratio {b['hit_ratio']:.4f}" in proc.stdout
    ratios = [float(r["hit_ratio"]) for r in rows]
    assert ratios == sorted(ratios) and int(rows[0]["budget_tokens"]) == 0
    assert summary["trace"]["visits"] == len(trace) and summary["total_tokens"] == int(np.sum(tokens))
    # Every visit accounted under the default policy: skipped ones are not in the curve, but counted.
    kinds = summary["trace"]["visit_kinds"]
    assert summary["options"]["over_limit"] == kinds["over_limit"] == "skip" and kinds["rebase_keep"] is None
    assert kinds["kinds"]["skipped"]["visits"] == len(trace.skipped_users) > 0
    assert kinds["visits"] == len(trace) + len(trace.skipped_users)
    assert "over the limit: skip;" in proc.stdout and "skipped" in proc.stdout


def test_each_policy_gives_its_own_curve_and_counts(long_store, tmp_path):
    from hstu_replay.plan.over_limit import KINDS, HistoryPolicy

    ratios = {}
    for policy in ("skip", "oldest", "rebase"):
        out = tmp_path / policy
        proc = _cli("plan", "cache-curve", "--store", str(long_store), "--max-history", "256", "--over-limit", policy,
                    "--rebase-keep", "0.25", "--budgets", "5000", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        summary = json.loads((out / "curve.json").read_text())
        trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1,
                            HistoryPolicy.of(policy, 0.25))
        kinds = summary["trace"]["visit_kinds"]
        assert [kinds["kinds"][k]["visits"] for k in KINDS] == list(trace.accounts().visits)
        assert [kinds["kinds"][k]["tokens"] for k in KINDS] == list(trace.accounts().tokens)
        assert kinds["visits"] == 1054  # every visit of the log, whatever the policy
        past = {"skip": "skipped", "oldest": "frozen", "rebase": "rebased"}[policy]
        assert kinds["kinds"][past]["visits"] > 0
        assert all(kinds["kinds"][k]["visits"] == 0 for k in ("skipped", "frozen", "rebased") if k != past)
        assert summary["total_tokens"] == int(trace.tokens.sum())
        ratios[policy] = summary["budgets"][0]["hit_ratio"]
    assert len(set(ratios.values())) == 3  # the rule moves the curve
    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--over-limit", "newest")
    assert proc.returncode == 2 and "--over-limit 'newest'" in proc.stderr, proc.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path, long_store):
    for args, words in ((("--store", str(tmp_path / "none")), "no such store"),
                        (("--store", str(long_store), "--budgets", "1e6"), "--budgets"),
                        (("--store", str(long_store), "--batch-size", "9"),
                         "--batch-size '9': use a whole number of users in 1..8")):
        proc = _cli("plan", "cache-curve", *args)
        assert proc.returncode == 2, proc
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_two_tier_grid_of_a_store_matches_its_replay_through_a_plain_two_tier_cache(long_store, tmp_path):
    from tests.oracle.server import TwoTierCache

    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--max-history", "256",
                "--budgets", "2000,5000", "--host-budgets", "3000,12000", "--offload-mode", "flexkv",
                "--out", str(tmp_path / "curve"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "curve" / "curve.json").read_text())
    grid = summary["tiers"]["grid"]
    assert [(p["gpu_budget_tokens"], p["host_budget_tokens"]) for p in grid] == [
        (2000, 3000), (2000, 12000), (5000, 3000), (5000, 12000)]
    assert len(list(csv.DictReader((tmp_path / "curve" / "curve_tiers.csv").open()))) == 4
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    total = int(trace.tokens.sum())
    for p in grid:
        cache = TwoTierCache(p["gpu_budget_tokens"], p["host_budget_tokens"], 32)
        hits = host = 0
        for u, t in zip(trace.cache_keys, trace.tokens):
            hits += cache.apply([int(u)], [int(t)])[0]
            host += cache.last_host_hits[0]
        assert (p["gpu_ratio"], p["host_ratio"]) == ((hits - host) / total, host / total), p
        assert f"gpu {p['gpu_budget_tokens']:>12,} host {p['host_budget_tokens']:>12,} tokens: gpu hit " \
               f"{p['gpu_ratio']:.4f} host hit {p['host_ratio']:.4f}" in proc.stdout
    assert grid[1]["host_ratio"] > 0 and grid[0]["host_ratio"] >= 0  # a host tier above the GPU's adds hits


def test_the_native_grid_at_another_offload_chunk_matches_the_plain_two_tier_cache_at_that_chunk(long_store,
                                                                                                 tmp_path):
    from tests.oracle.server import TwoTierCache

    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--max-history", "256", "--budgets", "2000",
                "--host-budgets", "12000", "--offload-mode", "native", "--offload-chunk-tokens", "64",
                "--out", str(tmp_path / "curve"))
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads((tmp_path / "curve" / "curve.json").read_text())["tiers"]["grid"]
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    cache = TwoTierCache(2000, 12000, 32, "native", chunk_tokens=64)
    hits = host = 0
    for u, t in zip(trace.cache_keys, trace.tokens):
        hits += cache.apply([int(u)], [int(t)])[0]
        host += cache.last_host_hits[0]
    total = int(trace.tokens.sum())
    assert host > 0 and (point["gpu_ratio"], point["host_ratio"]) == ((hits - host) / total, host / total)
    refused = _cli("plan", "cache-curve", "--store", str(long_store), "--offload-chunk-tokens", "0")
    assert refused.returncode == 2 and "--offload-chunk-tokens must be >= 1, got 0" in refused.stderr


def test_host_budgets_need_the_gpu_budgets_of_the_grid(long_store):
    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--host-budgets", "3000")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "hstu-replay: error: --host-budgets '3000': give the GPU budgets of the grid with --budgets"]
