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
        assert not [k for row in tab for k in row if k.startswith("tier_")]  # one tier: no tier columns
        with urllib.request.urlopen(f"{base}/hstu/charts", timeout=5) as response:
            assert "Cache tiers" not in response.read().decode()
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
    assert report["interrupted"] is None  # a run of the web UI that ended by itself: the SIGTERM came after
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
                "errors": 1, "mismatches": 0}

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
    assert (first["errors"], first["mismatches"]) == (1, 0)
    assert first["flags"] == "thin: 3 measured requests < 30; off-target: 0.457 is 0.043 away"
    assert (second["source"], second["flags"]) == ("server-reported (observed)", "ok")
    assert (natural["target"], natural["achieved"]) == ("natural", "0.800")


def test_the_tab_shows_the_tier_columns_of_a_run_steered_by_tier(oracle_servers, sample_store, tmp_path):
    """Through the tab's JSON (/stats/requests) and its chart box (/hstu/charts): a run steered to a
    tier mix against the two-tier oracle carries each stage's tier figures, the same as report.json."""
    oracle = oracle_servers(cached_tokens=True, budget_tokens=3000, host_budget_tokens=9000)
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "locust.log").open("w")
    process = subprocess.Popen(
        locust_command("--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING",
                       "--triton-url", oracle.grpc_url, "--workload", "sessions", "--store", str(sample_store),
                       "--hit-ratios", "0.8", "--batch-sizes", "1,4", "--stage-seconds", "3", "--warmup-seconds", "1",
                       "--max-history", "256", "--verify-fraction", "0", "--cache-budget-tokens", "3000",
                       "--host-budget-tokens", "9000", "--tier-mix", "gpu:0.6,host:0.3,miss:0.1",
                       "--offload-mode", "flexkv", "--report-dir", str(tmp_path / "run")),
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "ready", 60, "the web UI")
        assert post_form(f"{base}/swarm", {"user_count": 2, "spawn_rate": 2})["success"]
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "running", 30, "the run to start")
        wait_until(lambda: get_json(f"{base}/stats/requests")["state"] == "stopped", 60, "the run to end")
        wait_until(lambda: (tmp_path / "run" / "report.json").is_file(), 10, "the report")
        tab = get_json(f"{base}/stats/requests")["extended_stats"][0]["data"]
        with urllib.request.urlopen(f"{base}/hstu/charts", timeout=5) as response:
            charts = response.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [row["bin"] for row in tab] == [s["name"] for s in report["stages"]] == ["b1_h0.80", "b4_h0.80"]
    for row, stage in zip(tab, report["stages"]):
        t = stage["tiers"]
        assert (row["tier_source"], row["tier_target_mix"]) == ("observed", "gpu:0.6,host:0.3,miss:0.1")
        for tier in ("gpu", "host", "miss"):
            assert row[f"tier_mix_{tier}"] == f"{t['mix'][tier]:.3f}", (row, t)
        assert (row["tier_gpu_ratio"], row["tier_host_ratio"]) == (f"{t['gpu_ratio']:.3f}", f"{t['host_ratio']:.3f}")
        assert sum(t["observed"]["users"].values()) > 0
    assert "Cache tiers: GPU hit, host hit, miss" in charts and "gpu:0.6,host:0.3,miss:0.1" in charts


def test_tab_rows_carry_tier_columns_only_where_the_run_has_tiers():
    from hstu_replay.loadtest.webui import charts_fragment, rows
    from hstu_replay.report.flags import StageRules
    from hstu_replay.report.summary import build_report
    from hstu_replay.stats.run_stats import BinKey, RunStats
    from tests.report.test_tier_section import one_tier, tiered_report

    (row,) = rows(tiered_report())  # 10 users: 7 GPU, 2 host, 1 miss; 350 + 150 of 1,000 tokens
    assert {k: v for k, v in row.items() if k.startswith("tier_")} == {
        "tier_source": "observed", "tier_gpu_ratio": "0.350", "tier_host_ratio": "0.150", "tier_mix_gpu": "0.700",
        "tier_mix_host": "0.200", "tier_mix_miss": "0.100", "tier_target_mix": "gpu:0.6,host:0.3,miss:0.1",
        "tier_mix_distance": "0.100"}
    assert "Cache tiers: GPU hit, host hit, miss" in charts_fragment(tiered_report())
    plain = build_report(RunStats({BinKey(1, 0.5): one_tier()}), {"options": {}, "reports_tiers": True},
                         rules=StageRules())
    assert not [k for k in rows(plain)[0] if k.startswith("tier_")]
    assert "Cache tiers" not in charts_fragment(plain)


def test_the_tab_shows_each_server_of_a_fleet():
    from hstu_replay.loadtest.webui import charts_fragment
    from tests.report.test_fleet_section import ADDRESSES, report, stats

    fragment = charts_fragment(report(stats((30, 20, 10), (10, 10, 10))))
    assert "Fleet: 3 servers, --routing key-hash" in fragment and all(a in fragment for a in ADDRESSES)
    assert "Fleet" not in charts_fragment(report(stats((30, 20, 10), (10, 10, 10))) | {"fleet": None})
