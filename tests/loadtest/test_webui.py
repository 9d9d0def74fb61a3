"""Locust's web UI driving real runs: a rerun from the form starts clean, with the paths as edited
(below --web-paths-root; one outside it is refused with no load started)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from hstu_replay.loadtest.records import read_records
from tests.conftest import ROOT, free_ports, locust_command, wait_until

pytestmark = pytest.mark.integration


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def post_form(url: str, form: dict) -> dict:
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as response:
        return json.loads(response.read())


def test_a_rerun_from_the_web_ui_starts_clean(triton_server, reference_dumps, tmp_path):
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "locust.log").open("w")
    process = subprocess.Popen(
        locust_command("--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING",
                       "--triton-url", triton_server.grpc_url, "--workload", "dumps", "--dump-dir", str(reference_dumps),
                       "--hit-ratios", "0,1.0", "--batch-sizes", "1", "--stage-seconds", "2", "--warmup-seconds", "0.5",
                       "--max-history", "256", "--report-dir", str(tmp_path / "unused"),
                       "--web-paths-root", str(tmp_path)),  # the form may set paths below it
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "ready", 60, "the web UI")
        outside = tmp_path.parent / f"{tmp_path.name}-outside"
        reply = post_form(f"{base}/swarm", {"user_count": 2, "spawn_rate": 2, "report_dir": str(outside)})
        assert not reply["success"] and "outside --web-paths-root" in reply["message"], reply
        time.sleep(1)
        assert get_json(f"{base}/stats/requests")["state"] == "ready" and not outside.exists()  # no load started
        for run in ("first", "second"):
            reply = post_form(f"{base}/swarm", {"user_count": 2, "spawn_rate": 2, "report_dir": str(tmp_path / run)})
            assert reply["success"], reply
            wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "running", 30, f"the {run} run to start")
            wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "stopped", 60, f"the {run} run to end")
            wait_until(lambda: (tmp_path / run / "report.json").is_file(), 10, f"the {run} report")
        stats = get_json(f"{base}/stats/requests")
        tab = stats["extended_stats"][0]["data"]
        assert [row["bin"] for row in tab] == ["b1_h0.00", "b1_h1.00"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert not (tmp_path / "unused").exists()  # the path edited in the form was used, each time
    first, second = read_records(tmp_path / "first"), read_records(tmp_path / "second")
    assert first and second
    assert {r["user"] for r in second} == {0, 1}  # the user counter started again
    assert not {k for r in first for k in r["keys"]} & {k for r in second for k in r["keys"]}
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert sum(b["requests"] for b in report["bins"]) == sum(r["kind"] == "measure" for r in second)
    # the live tab and Locust's own counters show the second run only
    assert [int(row["requests"]) for row in tab] == [b["requests"] for b in report["bins"]]
    locust_total = next(row for row in stats["stats"] if row["name"] == "Aggregated")["num_requests"]
    assert locust_total == len(second)  # one Locust request event per record: none of the first run's


def test_tab_rows_carry_target_provenance_and_flag_reasons():
    from hstu_replay.loadtest.webui import rows

    def bin_(name, target, achieved, source):
        return {"name": name, "batch_size": 8, "target_ratio": target, "achieved_ratio": achieved,
                "hit_source": source, "requests": 3, "prime_requests": 2, "throughput_rps": 1.25,
                "server_rps": 2.5, "mean_ms": 10.0, "p50_ms": 9.996, "p99_ms": None, "speedup": None,
                "mismatches": 0}

    report = {"bins": [bin_("b8_h0.50", 0.5, 0.4567, "predicted"), bin_("b8_h1.00", 1.0, 1.0, "observed"),
                       bin_("b8_natural", None, 0.8, "observed")],  # a natural replay has no target
              "stages": [{"name": "b8_h0.50", "flags": [{"flag": "thin", "reason": "3 measured requests < 30"},
                                                        {"flag": "off-target",
                                                         "reason": "0.457 is 0.043 away"}]},
                         {"name": "b8_h1.00", "flags": []}, {"name": "b8_natural", "flags": []}]}
    first, second, natural = rows(report)
    assert (first["bin"], first["batch"], first["target"], first["achieved"], first["source"]) == (
        "b8_h0.50", 8, "0.5", "0.457", "client cache model (predicted)")
    assert (first["rps"], first["server_rps"], first["p50"], first["p99"], first["speedup"]) == (
        "1.2", "2.5", "10.00", "", "")  # 1.25 rounds half to even; null figures stay empty
    assert first["flags"] == "thin: 3 measured requests < 30; off-target: 0.457 is 0.043 away"
    assert (second["source"], second["flags"]) == ("server-reported (observed)", "ok")
    assert (natural["target"], natural["achieved"]) == ("natural", "0.800")
