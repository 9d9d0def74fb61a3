"""`hstu-replay plan cache-curve`: files written, figures consistent with the ledger, bad input one line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np

from hstu_replay.cache_ledger import CacheLedger
from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.timeline import build_trace


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hstu_replay.cli", *args], capture_output=True, text=True)


def test_the_curve_of_a_store_matches_its_replay_through_the_ledger(long_store, tmp_path):
    proc = _cli("plan", "cache-curve", "--store", str(long_store), "--max-history", "256",
                "--budgets", "2000,5000,20000", "--out", str(tmp_path / "curve"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "curve" / "curve.json").read_text())
    rows = list(csv.DictReader((tmp_path / "curve" / "curve.csv").open()))
    assert (tmp_path / "curve" / "curve.png").stat().st_size > 1000
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


def test_bad_input_is_one_line_and_exit_2(tmp_path, long_store):
    for args, words in ((("--store", str(tmp_path / "none")), "no such store"),
                        (("--store", str(long_store), "--budgets", "1e6"), "--budgets"),
                        (("--store", str(long_store), "--batch-size", "9"), "--batch-size")):
        proc = _cli("plan", "cache-curve", *args)
        assert proc.returncode == 2, proc
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
