"""`capacity run --verify-fleet`: the plan's step options aimed at a fleet, what it writes, and a real
run that starts the fleet a plan names and drives it at the target rate (marked integration)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hstu_replay.capacity.driver import LOAD_KINDS, CapacityPlan
from hstu_replay.capacity.fleet_check import check_dict, check_line, fleet_plan
from hstu_replay.capacity.search import Measurement, Slo, StepResult
from hstu_replay.cli import main

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_the_fleet_step_drops_the_measured_address_and_routes_by_key(tmp_path):
    plan = CapacityPlan((0.5,), LOAD_KINDS["users"], (1, 2), Slo(50), tmp_path, batch_size=8,
                        workload_args=("--workload", "sessions", "--store", "s", "--triton-url", "h:1",
                                       "--max-history", "64"), metrics_url="http://h:2/metrics")
    fleet = fleet_plan(plan, ["a:1", "b:1"])
    assert fleet.workload_args == ("--workload", "sessions", "--store", "s", "--max-history", "64",
                                   "--host", "a:1,b:1", "--routing", "key-hash")
    assert fleet.load_kind is LOAD_KINDS["rate"] and fleet.out_dir == tmp_path / "fleet"
    assert fleet.metrics_url is None  # one server's endpoint says nothing of the fleet


def test_a_check_reads_as_measured_against_planned():
    from hstu_replay.capacity.fleet_check import FleetCheck

    planned = StepResult(Measurement(40, p99_ms=98.5, logical_throughput=315.0))
    step = StepResult(Measurement(50, p99_ms=250.0, logical_throughput=390.0, achieved_ratio=0.49),
                      ("p99 250 ms > 200",))
    fleet = {"stages": [{"imbalance": 1.2, "servers": [{"server": "a:1", "requests": 60, "share": 0.6,
                                                         "observed_ratio": 0.5, "p99_ms": 300.0},
                                                        {"server": "b:1", "requests": 40, "share": 0.4,
                                                         "observed_ratio": 0.48, "p99_ms": 90.0}]}]}
    check = FleetCheck(0.5, 2, 50.0, planned, step, fleet)
    d = check_dict(check)
    assert (d["meets_slo"], d["planned_p99_ms"], d["measured_p99_ms"], d["imbalance"]) == (False, 98.5, 250.0, 1.2)
    assert [r["observed_ratio"] for r in d["per_server"]] == [0.5, 0.48]
    assert check_line(check).endswith("hit ratio per server 0.500, 0.480: MISSES the SLO (p99 250 ms > 200)")


@pytest.mark.parametrize("extra, message", [
    ((), "--verify-fleet runs the fleet the plan names for --target-rps"),
    (("--target-rps", "100"), "--verify-fleet starts the reference servers"),
])
def test_verify_fleet_needs_a_target_and_a_repository(extra, message, capsys, tmp_path):
    code = main(["capacity", "run", "--workload", "dumps", "--dump-dir", str(tmp_path), "--users-steps", "1",
                 "--slo-p99-ms", "50", "--verify-fleet", *extra])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.integration
def test_the_fleet_a_plan_names_is_started_and_driven_at_the_target(triton_server, compiled_repository, sample_store,
                                                                    tmp_path):
    out = tmp_path / "capacity"
    command = [str(BIN / "hstu-replay"), "capacity", "run", "--workload", "sessions", "--store", str(sample_store),
               "--triton-url", triton_server.grpc_url, "--rate-steps", "10,20", "--slo-p99-ms", "60000",
               "--target-rps", "240", "--batch-size", "8", "--step-seconds", "3", "--warmup-seconds", "1",
               "--max-history", "128", "--hit-ratios", "0.5", "--verify-fleet", "--repository",
               str(compiled_repository), "--serve-args=--device cpu --threads 1", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "capacity.json").read_text())
    (ratio,) = data["ratios"]
    (check,) = data["fleet_checks"]
    assert check["servers"] == ratio["servers_needed"] >= 2  # 240 logical/s is beyond one server's 20 x 8
    assert check["request_rate"] == 30.0 and check["meets_slo"]
    assert len(check["per_server"]) == check["servers"]
    for server in check["per_server"]:  # every server of the fleet took load and met the plan's ratio
        assert server["requests"] > 0 and abs(server["observed_ratio"] - 0.5) < 0.1, server
    assert check["measured_logical_rps"] > 0.8 * 240
    assert "The fleet each plan names, run" in (out / "capacity.html").read_text()
    assert f"fleet of {check['servers']} at hit ratio 0.5" in done.stdout
