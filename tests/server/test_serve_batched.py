"""`hstu-replay server serve --engine batched` on a real tritonserver, driven by a real headless Locust run."""

from __future__ import annotations

import urllib.request

import pytest

from tests.conftest import run_locust, start_server, stop_server

pytestmark = pytest.mark.integration


def test_the_batched_engine_answers_the_compiled_packages_dumps(reference_dumps, tmp_path):
    # the batched engine compiles nothing: the repository is never read
    server = start_server(tmp_path / "unused-repository", tmp_path / "batched.log", "--engine", "batched",
                          "--config", "small", "--cache-budget-tokens", "65536")
    try:
        result = run_locust(
            tmp_path / "report", "-u", "1", "-r", "1", "--triton-url", server.grpc_url, "--workload", "dumps",
            "--dump-dir", str(reference_dumps), "--hit-ratios", "0,0.5,1.0", "--batch-sizes", "8",
            "--stage-seconds", "3", "--warmup-seconds", "1", "--max-history", "256", "--max-mismatches", "0",
        )
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.cache_metrics}/metrics").read().decode()
    finally:
        code = stop_server(server)
    assert code == 0, (tmp_path / "batched.log").read_text(errors="replace")[-2000:]
    assert result.returncode == 0, result.stderr[-2000:]
    report = result.report
    assert report["run"]["interface"] == "kvcache"
    assert report["thresholds"]["passed"], report["thresholds"]
    verification = report["verification"]
    assert verification["mismatches"] == 0
    assert verification["verified"] == sum(b["requests"] for b in report["bins"]) > 0
    for stage in report["stages"]:
        assert stage["requests"] > 0, stage
        assert stage["hit_disagreements"] == 0, stage  # the server's CACHED_TOKENS are the ledger's
        assert stage["observed_ratio"] == pytest.approx(stage["predicted_ratio"]), stage
    values = dict(line.split() for line in metrics.splitlines() if line and not line.startswith("#"))
    assert int(values["hstu_kvcache_hit_tokens_total"]) > 0
    assert not (tmp_path / "unused-repository").exists()
