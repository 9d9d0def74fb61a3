"""`hstu-replay server serve --engine batched` on a real tritonserver, driven by a real headless Locust run."""

from __future__ import annotations

import urllib.request

import pytest

from tests.conftest import MACHINE_LENIENT, run_locust, start_server, stop_server
from tests.exposition import exposed

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("engine", ["batched", "batched-aoti"])
def test_the_batched_engine_answers_the_compiled_packages_dumps(engine, reference_dumps, batched_step_repository,
                                                                 tmp_path):
    # eager, the batched engine compiles nothing and never reads the repository; compiled, it loads its
    # package from there (compiled once per session by the fixture, as `serve` would)
    repository = batched_step_repository if engine == "batched-aoti" else tmp_path / "unused-repository"
    packages = sorted(repository.rglob("*.pt2"))
    server = start_server(repository, tmp_path / "batched.log", "--engine", engine,
                          "--config", "small", "--cache-budget-tokens", "65536")
    try:
        result = run_locust(
            tmp_path / "report", "-u", "1", "-r", "1", "--triton-url", server.grpc_url, "--workload", "dumps",
            "--dump-dir", str(reference_dumps), "--hit-ratios", "0,0.5,1.0", "--batch-sizes", "8",
            "--stage-seconds", "3", "--warmup-seconds", "1", "--max-history", "256", "--max-mismatches", "0",
            *MACHINE_LENIENT,  # 3 s stages on a loaded 2-core machine can fall below the default 30
        )
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.cache_metrics}/metrics").read().decode()
    finally:
        code = stop_server(server)
    assert code == 0, (tmp_path / "batched.log").read_text(errors="replace")[-2000:]
    assert result.violations_but_the_machines() == []
    report = result.report
    assert report["run"]["interface"] == "kvcache"
    verification = report["verification"]
    assert verification["mismatches"] == 0
    assert verification["verified"] == sum(b["requests"] for b in report["bins"]) > 0
    for stage in report["stages"]:
        assert stage["requests"] > 0, stage
        assert stage["hit_disagreements"] == 0, stage  # the server's CACHED_TOKENS are the ledger's
        assert stage["observed_ratio"] == pytest.approx(stage["predicted_ratio"]), stage
    values = exposed(metrics)
    assert int(values["hstu_kvcache_hit_tokens_total"]) > 0
    assert sorted(repository.rglob("*.pt2")) == packages  # nothing compiled again
    assert engine == "batched-aoti" or not repository.exists()
