"""`hstu-replay capacity natural` on the small config: real target per budget, real natural replay."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.analysis.cache_curve import cache_curve
from hstu_replay.plan.timeline import build_trace, group_requests

pytestmark = pytest.mark.integration


def _natural(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hstu_replay.cli", "capacity", "natural", *args],
                          capture_output=True, text=True, timeout=400)


def test_the_smallest_budget_meeting_the_slo_with_computed_and_measured_figures(compiled_repository, long_store,
                                                                                tmp_path):
    common = ("--store", str(long_store), "--repository", str(compiled_repository), "--request-rate", "15",
              "--users", "2", "--step-seconds", "6", "--warmup-seconds", "2", "--max-history", "256",
              "--serve-args", "--threads 1")
    proc = _natural(*common, "--slo-p99-ms", "5000", "--curve-ratios", "0.9,0.5", "--out", str(tmp_path / "a"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "a" / "capacity_natural.json").read_text())
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    curve = cache_curve(trace.cache_keys, trace.tokens, group_requests(trace, 0, 1))
    smallest = curve.budget_for(0.5)
    assert curve.ratio(smallest) >= 0.5 > curve.ratio(smallest - 32)  # picked where the curve reaches 0.5
    (step,) = result["steps"]  # the smallest budget already meets a loose SLO: nothing larger is run
    assert step["budget_tokens"] == smallest and step["passed"]
    assert result["answer"] == {"budget_tokens": smallest, "servers": 1, "total_tokens": smallest,
                                "shards_measured": 1}
    assert step["computed"]["hit_ratio"] == curve.ratio(smallest)
    assert step["measured"]["hit_source"] == "observed"
    assert step["measured"]["hit_ratio"] == pytest.approx(step["computed"]["window_hit_ratio"], abs=0.02)
    assert set(result["labels"]) == {"computed", "measured"}
    kinds = result["curve"]["visit_kinds"]  # the default --over-limit skip, every visit of the log counted
    assert kinds["log"]["over_limit"] == "skip" and kinds["log"]["visits"] == len(trace) + len(trace.skipped_users)
    assert kinds["log"]["kinds"]["skipped"]["visits"] == len(trace.skipped_users) > 0
    assert kinds["servers"]["1"] == [kinds["log"]] and "over the limit: skip;" in proc.stdout
    assert f"{smallest:,} tokens per server x 1 server(s)" in proc.stdout

    proc = _natural(*common, "--slo-p99-ms", "0.001", "--budgets", "1000", "--max-servers", "2",
                    "--out", str(tmp_path / "b"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    result = json.loads((tmp_path / "b" / "capacity_natural.json").read_text())
    assert [(s["budget_tokens"], s["servers"], s["passed"]) for s in result["steps"]] == [(1000, 1, False),
                                                                                          (1000, 2, False)]
    assert result["answer"] is None and "no budget measured meets" in proc.stderr
    two = result["steps"][1]  # with 2 servers every shard is measured, each against its own target
    assert two["shards_measured"] == 2 and [s["shard"] for s in two["shards"]] == [0, 1]
    assert len({s["report_dir"] for s in two["shards"]}) == 2
    assert two["measured"]["p99_ms"] == max(s["measured"]["p99_ms"] for s in two["shards"])  # the worst shard
    assert two["measured"]["throughput_rps"] == pytest.approx(sum(s["measured"]["throughput_rps"]
                                                                  for s in two["shards"]))
    for shard in two["shards"]:  # each shard's measured ratio is its own window's curve figure
        assert shard["measured"]["hit_ratio"] == pytest.approx(shard["computed"]["window_hit_ratio"], abs=0.02)
    assert two["spread"]["curve_ratio"]["shards"] == 2 and two["spread"]["measured_p99_ms"]["shards"] == 2
    assert "shards measured 2 of 2; curve ratio over all 2 shards" in proc.stdout
    page = (tmp_path / "b" / "capacity_natural.html").read_text()
    assert "Each shard" in page and "2 of 2" in page


def test_bad_options_are_one_line(tmp_path, long_store):
    for bad, flag in ((("--slo-p99-ms", "x"), "--slo-p99-ms"), (("--over-limit", "newest"), "--over-limit"),
                      (("--over-limit", "rebase", "--rebase-keep", "0"), "--rebase-keep")):
        proc = _natural("--store", str(long_store), "--repository", str(tmp_path), "--slo-p99-ms", "100",
                        "--request-rate", "5", *bad)
        assert proc.returncode == 2 and flag in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, bad


def test_a_host_tier_behind_each_budget_computed_per_tier_and_passed_to_target_and_client(long_store, tmp_path):
    """With --host-budget-tokens every step's target and client get the host tier, and each step's
    computed figures per tier are a plain two-tier replay's of the servers' shares (a stand-in runs the steps)."""
    from hstu_replay.capacity.natural import NaturalPlan, plan_capacity, step_command
    from hstu_replay.capacity.search import Measurement, Slo
    from hstu_replay.plan.timeline import shard_trace
    from tests.oracle.server import TwoTierCache

    plan = NaturalPlan(str(long_store), str(tmp_path), tmp_path, Slo(100.0, 0.01), 10.0, budgets=(1500, 4000),
                       max_servers=2, max_history=256, host_budget_tokens=6000)
    command = step_command(plan, "127.0.0.1:1", 1500, 1, 0, tmp_path)
    assert command[command.index("--host-budget-tokens") + 1] == "6000" and "--offload-mode" in command
    steps = []

    def run(plan_, budget, servers, shard):
        report_dir = tmp_path / f"{budget}_{servers}_{shard}"
        report_dir.mkdir()
        tiers = {"gpu_ratio": 0.25, "host_ratio": 0.5, "mix": {"gpu": 0.5, "host": 0.4, "miss": 0.1},
                 "source": "observed"}
        (report_dir / "report.json").write_text(json.dumps({"stages": [{"tiers": tiers}], "bins": []}))
        steps.append((budget, servers))
        p99 = 50.0 if servers == 2 and budget == 4000 else 500.0
        return Measurement(float(budget), requests=40, throughput_rps=10.0, p50_ms=1.0, p99_ms=p99, error_ratio=0.0,
                           achieved_ratio=0.5, hit_source="observed", report_dir=str(report_dir))

    result = plan_capacity(plan, run, say=lambda line: None)
    assert steps == [(1500, 1), (1500, 2), (1500, 2), (4000, 1), (4000, 2), (4000, 2)]
    assert result["answer"] == {"budget_tokens": 4000, "servers": 2, "total_tokens": 8000, "shards_measured": 2,
                                "host_budget_tokens": 6000}
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    for step in result["steps"]:
        gpu = host = tokens = 0
        for i in range(step["servers"]):
            share = shard_trace(trace, i, step["servers"])
            cache = TwoTierCache(step["budget_tokens"], 6000, 32)
            for key, total in zip(share.cache_keys, share.tokens):
                hits = cache.apply([int(key)], [int(total)])[0]
                host += cache.last_host_hits[0]
                gpu += hits - cache.last_host_hits[0]
                tokens += int(total)
        assert step["tiers"]["computed"] == {"gpu_ratio": gpu / tokens, "host_ratio": host / tokens}, step
        assert step["tiers"]["measured"][0]["host_ratio"] == 0.5
    assert result["steps"][0]["tiers"]["computed"]["host_ratio"] > 0


def test_behind_each_host_budget_the_gpu_memory_that_meets_the_slo(long_store, tmp_path):
    """--host-budgets: the GPU search runs behind each host budget; the frontier says what each needs and the
    answer is the pair with the least GPU memory (a stand-in runs the steps: a host tier lets a smaller GPU pass)."""
    from hstu_replay.capacity.natural import NaturalPlan, plan_capacity
    from hstu_replay.capacity.search import Measurement, Slo

    plan = NaturalPlan(str(long_store), str(tmp_path), tmp_path, Slo(100.0, 0.01), 10.0, budgets=(1500, 4000),
                       max_history=256, host_budgets=(0, 6000))
    seen = []

    def run(plan_, budget, servers, shard):
        seen.append((plan_.host_budget_tokens, budget))
        passes = budget >= (1500 if plan_.host_budget_tokens else 4000)
        return Measurement(float(budget), requests=40, throughput_rps=10.0, p50_ms=1.0,
                           p99_ms=50.0 if passes else 500.0, error_ratio=0.0, achieved_ratio=0.5)

    result = plan_capacity(plan, run, say=lambda line: None)
    assert seen == [(0, 1500), (0, 4000), (6000, 1500)]
    assert [(f["host_budget_tokens"], f["answer"]["budget_tokens"]) for f in result["frontier"]] == [(0, 4000),
                                                                                                    (6000, 1500)]
    assert result["answer"]["budget_tokens"] == 1500 and result["answer"]["host_budget_tokens"] == 6000
    assert [s["tiers"] is None for s in result["steps"]] == [True, True, False]
