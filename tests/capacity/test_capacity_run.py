"""`hstu-replay capacity run`: options, step command lines, the written result, and real runs
against the real tritonserver (marked integration)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from hstu_replay.capacity import charts, files, tables
from hstu_replay.capacity.result import capacity_dict
from hstu_replay.capacity.cli import plan_from_args
from hstu_replay.capacity.driver import LOAD_KINDS, CapacityPlan, run_capacity, step_command
from hstu_replay.capacity.step_run import measurement_from_report
from hstu_replay.capacity.search import Measurement, Slo
from hstu_replay.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SVG = "{http://www.w3.org/2000/svg}"


def parse(*argv: str):
    return plan_from_args(build_parser().parse_args(["capacity", "run", *argv]))


# -- options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--users-steps", "1,2"], "--slo-p99-ms is required"),
    (["--slo-p99-ms", "50"], "give exactly one of --users-steps or --rate-steps"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--rate-steps", "5"], "exactly one"),
    (["--slo-p99-ms", "50", "--users-steps", "2,1"], "steps must ascend"),
    (["--slo-p99-ms", "50", "--users-steps", "1,1.5"], "whole number"),
    (["--slo-p99-ms", "50", "--rate-steps", "5,,10"], "comma-separated"),
    (["--slo-p99-ms", "0", "--users-steps", "1"], "--slo-p99-ms '0': must be > 0"),
    (["--slo-p99-ms", "x", "--users-steps", "1"], "expected a number"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--hit-ratios", "0,1.5"], "0..1"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--batch-size", "9"], "1..8"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--slo-error-ratio", "2"], "0..1"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--workload", "dumps"], "needs --dump-dir"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--locust-args", "--hit-ratios 0.5"], "set by capacity run"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--locust-args", "--tags 'a"], "--locust-args"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--step-timeout", "5"], "must exceed"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--metrics-url", "ftp://x"], "metrics address"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--host-budgets", "9000"], "--host-budgets needs --budgets"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--budgets", "3000"], "--budgets needs --repository"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--repository", "."], "--repository serves the built-in target"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--budgets", "3000", "--repository", "/no/such"], "no such folder"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--budgets", "3000", "--repository", ".", "--triton-url",
      "127.0.0.1:1"], "--triton-url: leave it out with --budgets"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--budgets", "3000,x", "--repository", "."], "--budgets"),
    (["--slo-p99-ms", "50", "--users-steps", "1", "--budgets", "3000", "--repository", ".", "--offload-mode",
      "lazy"], "--offload-mode 'lazy'"),
])
def test_bad_options_are_one_line_and_exit_2(argv, message, capsys):
    code = main(["capacity", "run", "--store", "s", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("hstu-replay: error:") and message in err[0], err


def test_plan_and_step_command_closed_loop(tmp_path):
    plan = parse("--slo-p99-ms", "50", "--users-steps", "1,2,4", "--hit-ratios", "0,1", "--workload", "dumps",
                 "--dump-dir", "d", "--triton-url", "h:1", "--max-history", "256", "--batch-size", "2",
                 "--locust-args", "--master --expect-workers 2", "--metrics-url", "h:8002", "--out", str(tmp_path))
    assert plan.load_kind is LOAD_KINDS["users"] and plan.loads == (1, 2, 4)
    assert plan.slo == Slo(50.0, 0.01) and plan.step_timeout_s == 132.0
    assert plan.metrics_url == "http://h:8002/metrics"
    assert plan.step_dir(1.0, 4) == tmp_path / "steps" / "h1.00_u4"
    cmd = step_command(plan, 1.0, 4, plan.step_dir(1.0, 4))
    assert cmd[:3] == [sys.executable, "-m", "locust"] and cmd[4].endswith("hstu_replay/locustfile.py")
    text = " ".join(cmd)
    for part in ("--headless --only-summary", "-u 4 -r 4", "--hit-ratios 1 ", "--batch-sizes 2",
                 "--stage-seconds 10 --warmup-seconds 2", "--workload dumps --dump-dir d --triton-url h:1",
                 "--max-history 256", "--master --expect-workers 2"):
        assert part in text, part
    assert "--arrival" not in text and "--store" not in text
    # dumps reach a partial hit ratio without a priming request per measured one
    assert cmd[cmd.index("--partial-hits") + 1] == "reuse"


def test_step_command_open_loop():
    plan = parse("--slo-p99-ms", "50", "--rate-steps", "5,10.5", "--rate-users", "3", "--store", "s")
    assert plan.load_kind is LOAD_KINDS["rate"] and plan.loads == (5.0, 10.5)
    text = " ".join(step_command(plan, 0.5, 10.5, Path("x")))
    assert "-u 3 -r 3 --arrival poisson --request-rate 10.5" in text and "--workload sessions --store s" in text
    assert "--partial-hits" not in text  # sessions grow warm keys; only dumps mix full hits and misses
    assert plan.step_name(0.5, 10.5) == "h0.50_r10.5"


BIN_CLOSED = {"requests": 50, "logical_requests": 100, "throughput_rps": 10.0, "logical_throughput": 20.0,
              "mean_ms": 40.0, "p50_ms": 35.0, "p99_ms": 90.0, "error_ratio": 0.0, "achieved_ratio": 0.5,
              "requested_rps": None, "corrected_mean_ms": None, "corrected_p50_ms": None, "corrected_p99_ms": None,
              "server": {"queue_ms": 1.0}}


def test_measurement_from_a_report():
    closed = measurement_from_report({"bins": [BIN_CLOSED], "errors": {"timeout": 2}}, 4)
    assert (closed.load, closed.p99_ms, closed.latency_basis, closed.logical_throughput) == (4, 90.0, "sent", 20.0)
    assert closed.errors == {"timeout": 2} and closed.server == {"queue_ms": 1.0}
    assert closed.client_cpu_ms_per_request is None and closed.client_bound is False
    stage = {"client_cpu_ms_per_request": 0.42, "flags": [{"flag": "client-bound", "reason": "busy"}]}
    busy = measurement_from_report({"bins": [BIN_CLOSED], "stages": [stage]}, 4)
    assert (busy.client_cpu_ms_per_request, busy.client_bound) == (0.42, True)
    opened = measurement_from_report({"bins": [dict(BIN_CLOSED, requested_rps=20.0, corrected_mean_ms=400.0,
                                                    corrected_p50_ms=300.0, corrected_p99_ms=900.0)]}, 20.0)
    assert (opened.mean_ms, opened.p50_ms, opened.p99_ms, opened.latency_basis) == (400.0, 300.0, 900.0, "intended")
    assert measurement_from_report({"bins": []}, 1).problem == "the report has no measured bin"


# -- the written result, from scripted steps --------------------------------------------------

def scripted(curve: dict[tuple[float, float], tuple[float, float, float]]):
    """A step runner reading (req/s, mean ms, p99 ms) per (ratio, load) from `curve`."""
    def run(plan: CapacityPlan, ratio: float, load: float) -> Measurement:
        rps, mean, p99 = curve[(ratio, load)]
        return Measurement(load=load, requests=int(rps * plan.step_seconds), throughput_rps=rps,
                           logical_throughput=rps, mean_ms=mean, p50_ms=mean, p99_ms=p99, error_ratio=0.0,
                           achieved_ratio=ratio, client_cpu_ms_per_request=10.0,
                           metrics={"triton": {"request_success": 10, "mean_queue_us": 5.0}},
                           report_dir=str(plan.step_dir(ratio, load)))
    return run


def test_result_files_from_scripted_steps(tmp_path):
    plan = parse("--slo-p99-ms", "100", "--users-steps", "1,2,4", "--hit-ratios", "0,1", "--target-rps", "100",
                 "--store", "s", "--triton-model", "<b>&model", "--out", str(tmp_path))
    curve = {(0.0, 1): (10, 50, 120), (0.0, 2): (12, 80, 150),
             (1.0, 1): (20, 40, 60), (1.0, 2): (36, 45, 80), (1.0, 4): (40, 90, 130)}
    result = run_capacity(plan, scripted(curve))
    assert result.unsustainable == [0.0]
    written = files.write_capacity(result)
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["passed"] is False and data["unsustainable"] == [0.0]
    assert data["slo"] == {"p99_ms": 100.0, "error_ratio": 0.01} and data["load"]["kind"] == "users"
    zero, one = data["ratios"]
    assert [s["load"] for s in zero["steps"]] == [1] and zero["sustainable"] is None
    assert zero["servers_needed"] is None and zero["stopped_at"] == 1
    assert [s["passed"] for s in one["steps"]] == [True, True, False]
    assert one["sustainable"]["load"] == 2 and one["sustainable"]["logical_throughput"] == 36
    assert one["knee"]["load"] == 2 and one["knee"]["power"] == pytest.approx(36 / 0.045)
    assert one["servers_needed"] == 3  # ceil(100 / 36)
    # 100 logical/s at batch 1 = 100 req/s x 10 ms of client CPU = 1 core; / 0.7 of a core each: 2 workers
    assert one["workers"] == {"rate_rps": 100.0, "basis": "target", "cpu_ms_per_request": 10.0, "core_share": 0.7,
                              "workers": 2, "client_bound": False}
    assert zero["workers"] is None and data["worker_cpu_share"] == 0.7
    assert one["steps"][0]["client_cpu_ms_per_request"] == 10.0
    assert one["steps"][0]["report_dir"] == "steps/h1.00_u1"
    assert one["steps"][2]["breaches"] == ["p99 130.000 ms > 100 ms"]
    rows = list(csv.DictReader((tmp_path / "capacity.csv").open()))
    assert len(rows) == 4 and rows[2]["sustainable"] == "True" and rows[2]["triton_mean_queue_us"] == "5.0"
    assert rows[2]["workers_needed"] == "2" and rows[0]["workers_needed"] == ""
    page = written["html"].read_text()
    assert "<b>&model" not in page and "&lt;b&gt;&amp;model" in page
    table = tables.format_summary(data)
    assert table.splitlines()[0].split()[:2] == ["hit", "ratio"] and "1.00" in table
    line = ("workers needed for 100 req/s (target 100 logical/s) at b1 h1.00: 2 "
            "(client CPU 10 ms/request, 70% of a core per worker)")
    assert line in table.splitlines() and "a cost per report, not per request" in table
    assert line in page
    assert written["svg"] == tmp_path / charts.THROUGHPUT_SVG
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg"') == 2  # both charts, inline
    p99 = ET.parse(tmp_path / charts.P99_SVG).getroot()
    # every step with its p99 as capacity.json has it, the breached ones crossed
    drawn = sorted((float(c.get("data-load")), float(c.get("data-value")), c.get("data-passed"))
                   for c in p99.iter(f"{SVG}circle"))
    assert drawn == sorted((s["load"], s["p99_ms"], str(s["passed"]).lower()) for r in data["ratios"] for s in r["steps"])
    assert len(list(p99.iter(f"{SVG}path"))) == sum(not s["passed"] for r in data["ratios"] for s in r["steps"]) + 1


def test_a_sustainable_step_below_other_passing_steps_is_explained(tmp_path):
    """2 users carried the most; 4 and 8 also met the SLO but carried less (saturated): the summary says
    sustainable 2, passed up to 8, and a line under it says why, in the numbers the step rows show."""
    from hstu_replay.capacity.search import StepResult

    plan = parse("--slo-p99-ms", "100", "--users-steps", "1,2,4,8", "--hit-ratios", "0.5", "--target-rps", "100",
                 "--store", "s", "--out", str(tmp_path))
    curve = {(0.5, 1): (20, 40, 50), (0.5, 2): (36, 45, 60), (0.5, 4): (35, 90, 95), (0.5, 8): (34.5, 95, 99)}
    data = capacity_dict(run_capacity(plan, scripted(curve)))
    (ratio,) = data["ratios"]
    assert (ratio["sustainable"]["load"], ratio["within_slo"]["load"], ratio["stopped_at"]) == (2, 8, None)
    summary = tables.summary_table(data)
    assert summary[0][1:3] == ["sustainable", "passed up to"] and summary[1][1:3] == ["2", "8"]
    text = tables.format_summary(data)
    assert tables.SUSTAINABLE_NOTE in text.splitlines()
    assert ("hit ratio 0.50: sustainable at users 2 (36.0 logical/s); users 4, 8 also met the SLO but carried "
            "no more (35.0, 34.5 logical/s): the server was saturated") in text.splitlines()
    steps = tables.steps_table(data)
    assert steps[0][:5] == ["hit ratio", "users", "req/s", "logical/s", "server req/s"] and steps[0][-1] == "verdict"
    assert [row[-1] for row in steps[1:]] == ["pass", "pass (sustainable)", "pass", "pass"]
    page = files.write_capacity(run_capacity(plan, scripted(curve)))["html"].read_text()
    assert "passed up to" in page and "users 4, 8 also met the SLO but carried no more" in page
    # the progress lines on the terminal sit under a header of the same columns
    header = tables.step_header_line("users")
    line = tables.step_line(0.5, StepResult(scripted(curve)(plan, 0.5, 4)), tmp_path, "users")
    assert header.split()[:3] == ["hit", "ratio", "users"] and line.split()[:4] == ["0.50", "4", "35.0", "35.0"]
    for name in ("users", "logical/s", "p99 ms", "verdict"):
        column = header.index(name) + len(name)  # figures are right-aligned under their header's end
        if name != "verdict":
            assert line[column - 1] != " " and line[column] == " ", name
    assert tables.step_header_line("offered req/s").split()[2:4] == ["offered", "req/s"]


def test_pools_are_every_gpu_and_host_pair():
    plan = parse("--slo-p99-ms", "50", "--users-steps", "1,2", "--store", "s", "--budgets", "6000,3000",
                 "--host-budgets", "9000,0", "--repository", ".", "--offload-mode", "flexkv",
                 "--serve-args", "--threads 1")
    assert [(p.gpu_tokens, p.host_tokens, p.offload_mode) for p in plan.pools] == [
        (3000, 0, "flexkv"), (3000, 9000, "flexkv"), (6000, 0, "flexkv"), (6000, 9000, "flexkv")]
    assert plan.pools[1].serve_args() == ("--cache-budget-tokens", "3000", "--host-budget-tokens", "9000",
                                          "--offload-mode", "flexkv")
    assert plan.serve_args == ("--threads", "1") and plan.repository == "."
    assert parse("--slo-p99-ms", "50", "--users-steps", "1", "--store", "s").pools == ()


def test_the_result_per_tier_budget(tmp_path):
    """Per (GPU, host) pair: users per GPU measured and interpolated to the SLO, from hand-worked steps."""
    from hstu_replay.capacity.driver import PoolsResult, CapacityResult
    from hstu_replay.capacity.search import step_until_breach, summarize

    plan = parse("--slo-p99-ms", "100", "--users-steps", "1,2,4", "--hit-ratios", "0.8", "--store", "s",
                 "--budgets", "3000", "--host-budgets", "0,9000", "--repository", ".", "--out", str(tmp_path))
    no_host, host = plan.pools
    # without a host tier: p99 60 ms at 2 users, 130 ms at 4 -> 2 + (100 - 60) * 2 / 70 = 3.14 users;
    # with one: every step passes, no crossing
    curves = {no_host: {1: (20, 30, 40), 2: (30, 45, 60), 4: (32, 90, 130)},
              host: {1: (22, 28, 35), 2: (40, 35, 50), 4: (38, 45, 80)}}  # 4 users carry less than 2, within the SLO
    groups = []
    for pools, curve in curves.items():
        run = scripted({(0.8, load): figures for load, figures in curve.items()})
        steps = step_until_breach(plan.loads, lambda load: run(plan, 0.8, load), plan.slo)
        groups.append(PoolsResult(pools, (summarize(0.8, steps, None),)))
    result = CapacityResult(plan, tuple(r for g in groups for r in g.ratios), "now", tuple(groups))
    written = files.write_capacity(result)
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["pools"] == [{"gpu_tokens": 3000, "host_tokens": 0, "offload_mode": "native"},
                             {"gpu_tokens": 3000, "host_tokens": 9000, "offload_mode": "native"}]
    first, second = data["ratios"]
    assert first["pools"]["host_tokens"] == 0 and second["pools"]["host_tokens"] == 9000
    assert (first["within_slo"]["load"], first["sustainable"]["load"], first["stopped_at"]) == (2, 2, 4)
    assert first["slo_crossing"] == pytest.approx(2 + 40 * 2 / 70)
    assert (second["within_slo"]["load"], second["stopped_at"], second["slo_crossing"]) == (4, None, None)
    assert second["sustainable"]["load"] == 2  # the peak throughput: not what "users per GPU" asks
    table = tables.pools_table(data)
    assert table[0][:5] == ["GPU tokens", "host tokens", "hit ratio", "concurrent users per GPU",
                            "at the SLO (interpolated)"]
    assert table[1][:7] == ["3,000", "0", "0.80", "2", "3.1", "30.0", "60.00"]
    assert table[2][:7] == ["3,000", "9,000", "0.80", "4", "-", "38.0", "80.00"]
    summary = tables.format_summary(data)
    assert "per tier budget (one server = one GPU):" in summary
    assert tables.summary_table(data)[0][:3] == ["GPU tokens", "host tokens", "hit ratio"]
    page = written["html"].read_text()
    assert "Users per GPU per tier budget" in page and "(3,000, 9,000)" in page
    rows = list(csv.DictReader((tmp_path / "capacity.csv").open()))
    assert [(r["gpu_tokens"], r["host_tokens"], r["load"]) for r in rows] == [
        ("3000", "0", "1"), ("3000", "0", "2"), ("3000", "0", "4"), ("3000", "9000", "1"), ("3000", "9000", "2"),
        ("3000", "9000", "4")]
    plain = capacity_dict(run_capacity(parse("--slo-p99-ms", "100", "--users-steps", "1",
                                                             "--hit-ratios", "0.8", "--store", "s",
                                                             "--out", str(tmp_path / "plain")),
                                                       scripted({(0.8, 1): (20, 30, 40)})))
    assert plain["pools"] == [] and tables.pools_table(plain) == []
    assert "per tier budget" not in tables.format_summary(plain)


# -- real runs (integration) ------------------------------------------------------------------

def capacity(out: Path, server, dumps, *args: str, timeout: float = 150.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "hstu-replay"), "capacity", "run", "--workload", "dumps", "--dump-dir", str(dumps),
         "--triton-url", server.grpc_url, "--max-history", "256", "--step-seconds", "4", "--warmup-seconds", "1",
         "--step-timeout", "60", "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


@pytest.mark.integration
def test_a_real_capacity_run(triton_server, reference_dumps, tmp_path):
    result = capacity(tmp_path, triton_server, reference_dumps, "--hit-ratios", "0,0.5,1.0", "--users-steps", "1,2",
                      "--slo-p99-ms", "60000", "--target-rps", "2000", "--batch-size", "8",
                      "--metrics-url", f"127.0.0.1:{triton_server.ports.metrics}",
                      "--cache-metrics-url", f"127.0.0.1:{triton_server.ports.cache_metrics}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert data["passed"] is True
    for ratio in data["ratios"]:
        assert [s["load"] for s in ratio["steps"]] == [1, 2]
        for step in ratio["steps"]:
            assert step["passed"] and step["requests"] > 0 and step["throughput_rps"] > 0
            assert abs(step["achieved_ratio"] - ratio["hit_ratio"]) <= 0.02
            assert step["latency_basis"] == "sent"
            triton = step["metrics"]["triton"]
            assert triton["request_success"] >= step["requests"]  # primes and warm-up count too
            assert triton["mean_compute_infer_us"] > 0 and "cpu_utilization" in triton
            assert (tmp_path / step["report_dir"] / "report.json").is_file()
        best = ratio["sustainable"]
        assert best["load"] in (1, 2) and ratio["knee"] is not None
        assert ratio["servers_needed"] == math.ceil(2000 / best["logical_throughput"])
        workers = ratio["workers"]  # to send 2000 logical/s = 250 requests/s of batch 8
        assert (workers["basis"], workers["rate_rps"], workers["core_share"]) == ("target", 250.0, 0.7)
        cpu = workers["cpu_ms_per_request"]
        sustainable_step = next(s for s in ratio["steps"] if s["load"] == best["load"])
        assert cpu == sustainable_step["client_cpu_ms_per_request"] and cpu > 0
        assert workers["workers"] == max(1, math.ceil(250 * cpu / 1e3 / 0.7 - 1e-9))
        assert f"workers needed for 250 req/s (target 2,000 logical/s) at b8 h{ratio['hit_ratio']:.2f}: " \
               f"{workers['workers']} (client CPU {cpu:.3g} ms/request" in result.stdout
    zero, half, one = data["ratios"]
    # Hits come from reused keys (no priming request before each measured one), so a higher ratio never
    # needs more servers than a cold cache: with a prime per request 0.5 needed more than 0 (39 to 30).
    assert (zero["hits_from"], half["hits_from"], one["hits_from"]) == ("none", "reuse", "reuse")
    assert one["sustainable"]["primes_per_request"] < 0.05 and half["sustainable"]["primes_per_request"] == 0
    assert one["servers_needed"] <= min(zero["servers_needed"], half["servers_needed"])  # by 3x and 2x here
    print("servers needed at 0, 0.5, 1.0:", [r["servers_needed"] for r in data["ratios"]],
          "server requests / measured at 0.5:", [(s["server"]["count"], s["requests"]) for s in half["steps"]])
    for step in half["steps"]:
        # what the bug was, in the server's own count (Triton's statistics over the measured window): a
        # measured request at 0.5 cost the server two requests, a prime and itself; now it costs one
        # (give or take the requests in flight when the window opened and closed)
        counted, measured = step["server"]["count"], step["requests"]
        assert measured >= 10 and counted <= 1.05 * measured + 2 * step["load"], (counted, measured)
        assert step["primes_per_request"] == 0 and step["server_rps"] == pytest.approx(step["throughput_rps"], rel=0.05)
    assert one["sustainable"]["logical_throughput"] > zero["sustainable"]["logical_throughput"]
    assert "hits from reuse" in result.stdout
    assert one["steps"][0]["metrics"]["cache"]["hit_tokens"] > 0
    assert zero["steps"][0]["metrics"]["cache"]["hit_tokens"] == 0
    assert len(list(csv.DictReader((tmp_path / "capacity.csv").open()))) == 6
    assert tables.step_header_line("users") in result.stdout.splitlines()  # the progress lines' header
    assert (tmp_path / "capacity.html").is_file()
    assert "servers" in result.stdout and "capacity written to" in result.stdout


@pytest.mark.integration
def test_an_slo_no_step_meets_exits_3_in_one_line(triton_server, reference_dumps, tmp_path):
    result = capacity(tmp_path, triton_server, reference_dumps, "--hit-ratios", "0", "--users-steps", "1,2",
                      "--slo-p99-ms", "0.001")
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hstu-replay: FAIL: no step met the SLO at hit ratio 0.00")
    assert "> 0.001 ms" in lines[0]
    data = json.loads((tmp_path / "capacity.json").read_text())
    (ratio,) = data["ratios"]
    assert [s["load"] for s in ratio["steps"]] == [1]  # stepping stopped at the first breach
    assert ratio["sustainable"] is None and ratio["servers_needed"] is None


@pytest.mark.integration
def test_a_step_that_never_ends_is_stopped_at_its_timeout(triton_server, reference_dumps, tmp_path):
    from tests.conftest import free_ports

    (port,) = free_ports(1)
    locust_args = f"--master --expect-workers 1 --master-bind-host 127.0.0.1 --master-bind-port {port}"
    result = capacity(tmp_path, triton_server, reference_dumps, "--hit-ratios", "0", "--users-steps", "1,2",
                      "--slo-p99-ms", "60000", "--step-timeout", "8", f"--locust-args={locust_args}")
    assert result.returncode == 3, result.stdout[-3000:] + result.stderr[-3000:]
    assert "timed out after 8 s" in result.stderr
    (ratio,) = json.loads((tmp_path / "capacity.json").read_text())["ratios"]
    (step,) = ratio["steps"]  # no worker ever came: the master waited until it was stopped
    assert step["breaches"] == ["timed out after 8 s"]


@pytest.mark.integration
def test_a_real_capacity_run_per_tier_budget(compiled_repository, sample_store, tmp_path):
    """The search behind two host budgets against the reference target itself: a GPU pool of 4 users'
    keys, no host tier or one of 12; each user cycles over 4 keys (--working-set 4), so 1 user's keys
    stay on the GPU and 2 users' (8 keys) leave it: onboarded from the host tier where there is one,
    recomputed where there is none. Each server's pools are what the client read from its control model."""
    from hstu_replay.cache_ledger import pages
    from hstu_replay.interface import history_tokens

    key = pages(history_tokens(256), 32) * 32  # 544 tokens a user
    gpu, host = 4 * key, 12 * key
    result = subprocess.run(
        [str(BIN / "hstu-replay"), "capacity", "run", "--workload", "sessions", "--store", str(sample_store),
         "--max-history", "256", "--hit-ratios", "1", "--users-steps", "1,2", "--slo-p99-ms", "60000",
         "--step-seconds", "3", "--warmup-seconds", "1.5", "--step-timeout", "90", "--budgets", str(gpu),
         "--host-budgets", f"0,{host}", "--offload-mode", "flexkv", "--repository", str(compiled_repository),
         "--serve-args", "--threads 1 --engine batched", "--locust-args", "--working-set 4", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=400, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((tmp_path / "capacity.json").read_text())
    assert [(p["gpu_tokens"], p["host_tokens"]) for p in data["pools"]] == [(gpu, 0), (gpu, host)]
    for ratio, pools in zip(data["ratios"], data["pools"]):
        assert ratio["pools"] == pools and ratio["within_slo"]["load"] == 2 and ratio["slo_crossing"] is None
        one, two = (json.loads((tmp_path / s["report_dir"] / "report.json").read_text()) for s in ratio["steps"])
        for report in (one, two):
            options = report["run"]["options"]
            assert (options["cache_budget_tokens"], options["host_budget_tokens"]) == (gpu, pools["host_tokens"])
        assert one["stages"][0]["tiers"]["mix"]["gpu"] >= 0.95, one["stages"][0]["tiers"]
        tiers = two["stages"][0]["tiers"]
        assert tiers["source"] == "observed"
        if pools["host_tokens"]:
            assert tiers["mix"]["host"] >= 0.5, tiers
        else:
            assert tiers["host_ratio"] == 0 and tiers["mix"]["miss"] >= 0.5, tiers
        print(f"pools {pools}: users per GPU {ratio['within_slo']['load']}, 2 users' mix {tiers['mix']}, "
              f"p99 {[s['p99_ms'] for s in ratio['steps']]}")
    assert "per tier budget (one server = one GPU):" in result.stdout
    assert "Users per GPU per tier budget" in (tmp_path / "capacity.html").read_text()
    assert (tmp_path / "pools" / f"g{gpu}_h{host}" / "server.log").is_file()
