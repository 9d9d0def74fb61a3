"""Two cache tiers under real Locust runs against the oracle server's two-tier variant: the tier mix
a run is steered to is met (within 0.02 of the target, by the oracle's own account), and what the
report says of each tier equals what the oracle saw (within 0.005), with and without the server's
HOST_CACHED_TOKENS, under a master and two workers and under open-loop Poisson arrivals; and
against the reference target's own two tiers (one process, and a master and two workers)."""

from __future__ import annotations

import pytest

from hstu_replay.loadtest.records import read_records
from tests.conftest import run_locust
from tests.loadtest.test_truth import seen_since

pytestmark = pytest.mark.integration

GPU, HOST = 3000, 9000
MIX = {"gpu": 0.6, "host": 0.3, "miss": 0.1}


def oracle_tiers(records: list[dict], seen: list[dict]) -> dict[str, dict]:
    """Per stage, from the oracle's record of the run's measured requests: users by tier, and hit
    tokens per tier over the history tokens."""
    by_keys: dict[tuple, list[dict]] = {}
    for entry in seen:
        by_keys.setdefault(tuple(entry["keys"]), []).append(entry)
    cursor: dict[tuple, int] = {}
    stages: dict[str, dict] = {}
    for record in sorted((r for r in records if r["ok"]), key=lambda r: r["t"]):
        keys = tuple(record["keys"])
        entry = by_keys[keys][cursor.get(keys, 0)]
        cursor[keys] = cursor.get(keys, 0) + 1
        if record["kind"] != "measure":
            continue
        s = stages.setdefault(record["stage"], {"gpu": 0, "host": 0, "miss": 0, "gpu_hits": 0, "host_hits": 0,
                                                "tokens": 0})
        for hit, onboarded, total in zip(entry["hits"], entry["host_hits"], entry["totals"]):
            s["host" if onboarded else "gpu" if hit else "miss"] += 1
            s["gpu_hits"] += hit - onboarded
            s["host_hits"] += onboarded
            s["tokens"] += total
    return stages


@pytest.mark.parametrize("host_report", [True, False], ids=["host-cached-tokens", "no-tier-report"])
def test_a_run_steered_to_a_tier_mix_meets_it_and_reports_what_the_oracle_saw(oracle_servers, sample_store,
                                                                              tmp_path, host_report):
    oracle = oracle_servers(cached_tokens=host_report, budget_tokens=GPU, host_budget_tokens=HOST)
    start = len(oracle.records())
    # with the server's tier report the budgets are given; without it they are read from its control model
    budgets = ("--cache-budget-tokens", str(GPU), "--host-budget-tokens", str(HOST)) if host_report else ()
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", oracle.grpc_url, "--workload", "sessions",
                        "--store", str(sample_store), "--hit-ratios", "0.8", "--batch-sizes", "1,4",
                        "--stage-seconds", "5", "--warmup-seconds", "2", "--max-history", "256",
                        "--verify-fraction", "0", *budgets, "--tier-mix", "gpu:0.6,host:0.3,miss:0.1",
                        "--offload-mode", "flexkv")
    assert result.returncode == 0, result.stderr[-3000:]
    said = "the server's control model gives its pools: GPU 3,000 tokens, host 9,000 tokens"
    assert (said in result.stderr) != host_report, result.stderr[-2000:]
    options = result.report["run"]["options"]
    assert (options["cache_budget_tokens"], options["host_budget_tokens"]) == (GPU, HOST)
    seen = seen_since(oracle, start)
    assert not [e for e in seen if e["violations"]]
    view = oracle_tiers(read_records(tmp_path), seen)
    assert "cache tiers" in result.stdout and "mix gpu" in result.stdout
    for stage in result.report["stages"]:
        tiers, o = stage["tiers"], view[stage["name"]]
        users = o["gpu"] + o["host"] + o["miss"]
        assert users >= 60, (stage["name"], users)
        assert tiers["source"] == ("observed" if host_report else "predicted")
        assert tiers["target_mix"] == MIX
        for tier, share in MIX.items():
            assert abs(o[tier] / users - share) <= 0.02, (stage["name"], tier, o)  # met, by the oracle's count
            assert abs(tiers["mix"][tier] - o[tier] / users) <= 0.005, (stage["name"], tier, tiers, o)
        assert abs(tiers["gpu_ratio"] - o["gpu_hits"] / o["tokens"]) <= 0.005, (tiers, o)
        assert abs(tiers["host_ratio"] - o["host_hits"] / o["tokens"]) <= 0.005, (tiers, o)
        assert not [f for f in stage["flags"] if f["flag"] == "off-target"], stage["flags"]
        print(f"{stage['name']}: mix reported {tiers['mix']} oracle "
              f"{ {t: round(o[t] / users, 4) for t in MIX} } over {users} users; gpu hit ratio "
              f"{tiers['gpu_ratio']:.4f} host {tiers['host_ratio']:.4f} ({tiers['source']})")
    assert (tmp_path / "report.html").read_text().count("Cache tiers: GPU hit, host hit, miss") == 1


@pytest.mark.parametrize("frontend, engine, repository", [
    ("pytriton", "batched", "compiled_repository"),
    ("cpp-backend", "batched-aoti", "batched_step_repository"),  # the host tier in C++
])
def test_the_client_model_predicts_every_request_of_the_reference_targets_two_tiers(frontend, engine, repository,
                                                                                   sample_store, tmp_path, request):
    """Against the reference target with a host tier (budgets read from its control model) the run
    steered to a mix meets it by the server's own HOST_CACHED_TOKENS, and the client's model predicted
    every request's hits as the server reported them."""
    from tests.conftest import start_server, stop_server

    server = start_server(request.getfixturevalue(repository), tmp_path / "server.log", "--engine", engine,
                          "--frontend", frontend, "--cache-budget-tokens", str(GPU), "--host-budget-tokens",
                          str(HOST), "--offload-mode", "flexkv", "--threads", "1", ready_timeout=600)
    try:
        # one user, as in the chunked test below: tiers are exact only in the order the model predicted
        result = run_locust(tmp_path / "run", "-u", "1", "-r", "1", "--triton-url", server.grpc_url,
                            "--workload", "sessions", "--store", str(sample_store), "--hit-ratios", "0.8",
                            "--batch-sizes", "1,4", "--stage-seconds", "6", "--warmup-seconds", "3",
                            "--max-history", "256", "--tier-mix", "gpu:0.6,host:0.3,miss:0.1",
                            "--offload-mode", "flexkv")
    finally:
        stop_server(server)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the server's control model gives its pools" in result.stderr
    assert result.report["run"]["reports_tiers"] is True
    for stage in result.report["stages"]:
        tiers = stage["tiers"]
        assert tiers["source"] == "observed" and stage["hit_disagreements"] == 0, stage
        assert tiers["observed"]["users"] == tiers["predicted"]["users"], tiers
        assert tiers["mix_distance"] <= 0.02 and sum(tiers["observed"]["users"].values()) >= 60, tiers
        print(f"{stage['name']}: reference target mix {tiers['mix']} (observed; model agreed on every request), "
              f"gpu hit ratio {tiers['gpu_ratio']:.4f} host {tiers['host_ratio']:.4f}")


@pytest.mark.parametrize("frontend, engine, repository", [
    ("pytriton", "batched", "compiled_repository"),
    ("cpp-backend", "batched-aoti", "batched_step_repository"),  # the C++ tier's own chunked offload
])
def test_a_server_offloading_in_chunks_of_64_is_predicted_by_a_client_told_its_chunk(frontend, engine, repository,
                                                                                     sample_store, tmp_path, request):
    """The reference target under native offload in chunks of 64 tokens (NVIDIA's default is 1,024):
    the client given the same --offload-chunk-tokens predicted every request's hits, per tier, as the
    server reported them, and the host tier served hits (histories of up to 518 tokens fill 64-token
    chunks; none would reach a 1,024-token one). At hit ratio 0.5 a host copy of h tokens is a hit for
    a history grown to 2h, which whole chunks of 64 allow."""
    from tests.conftest import start_server, stop_server

    chunk = ("--offload-mode", "native", "--offload-chunk-tokens", "64")
    server = start_server(request.getfixturevalue(repository), tmp_path / "server.log", "--engine", engine,
                          "--frontend", frontend, "--cache-budget-tokens", str(GPU), "--host-budget-tokens",
                          str(HOST), *chunk, "--threads", "1", ready_timeout=600)
    try:
        # one user: the model predicts in send order, and two users' requests in flight together can
        # reach the server the other way round, which moves the LRU order that tiers are exact about
        # (seen once against the C++ backend: one user of 3,500 a GPU hit where the model said host)
        result = run_locust(tmp_path / "run", "-u", "1", "-r", "1", "--triton-url", server.grpc_url,
                            "--workload", "sessions", "--store", str(sample_store), "--hit-ratios", "0.5",
                            "--batch-sizes", "1,4", "--stage-seconds", "6", "--warmup-seconds", "3",
                            "--max-history", "256", "--tier-mix", "gpu:0.6,host:0.3,miss:0.1", *chunk)
    finally:
        stop_server(server)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.report["run"]["options"]["offload_chunk_tokens"] == 64
    for stage in result.report["stages"]:
        tiers = stage["tiers"]
        assert tiers["source"] == "observed" and stage["hit_disagreements"] == 0, stage
        assert tiers["observed"]["users"] == tiers["predicted"]["users"], tiers
        assert tiers["observed"]["users"]["host"] > 0 and tiers["host_ratio"] > 0, tiers
        print(f"{stage['name']}: chunks of 64, mix {tiers['mix']} (observed, predicted alike), "
              f"gpu hit ratio {tiers['gpu_ratio']:.4f} host {tiers['host_ratio']:.4f}")


def test_master_and_workers_steered_to_a_tier_mix_meet_it_and_report_what_the_oracle_saw(oracle_servers,
                                                                                          sample_store, tmp_path):
    """Distributed: each worker steers its users against its share of both pools while the server's pools
    are shared; a host hit takes the middle host-only key by recency, host-only on the server too, so the
    mix is met within 0.02 by the oracle's count, and the report says what the oracle saw within 0.005."""
    import json

    from tests.conftest import run_distributed

    oracle = oracle_servers(cached_tokens=True, budget_tokens=2 * GPU, host_budget_tokens=2 * HOST)
    start = len(oracle.records())
    code, report_dir, log = run_distributed(
        tmp_path, "--triton-url", oracle.grpc_url, "--workload", "sessions", "--store", str(sample_store),
        "--hit-ratios", "0.8", "--batch-sizes", "1,4", "--stage-seconds", "8", "--warmup-seconds", "3",
        "--max-history", "256", "--verify-fraction", "0", "--cache-budget-tokens", str(2 * GPU),
        "--host-budget-tokens", str(2 * HOST), "--tier-mix", "gpu:0.6,host:0.3,miss:0.1", "--offload-mode", "flexkv",
        users=4, workers=2)
    assert code == 0, log[-3000:]
    assert "--tier-mix with 2 workers back to back: each steers against its share" in log
    report = json.loads((report_dir / "report.json").read_text())
    seen = seen_since(oracle, start)
    assert not [e for e in seen if e["violations"]]
    view = oracle_tiers(read_records(report_dir), seen)
    assert len(report["stages"]) == 2
    for stage in report["stages"]:
        o = view[stage["name"]]
        users = o["gpu"] + o["host"] + o["miss"]
        assert users >= 60, users
        achieved = {t: o[t] / users for t in MIX}
        print(f"distributed {stage['name']}: reported {stage['tiers']['mix']} oracle {achieved} over {users} users")
        for tier, share in MIX.items():
            assert abs(achieved[tier] - share) <= 0.02, (stage["name"], tier, achieved)
            assert abs(stage["tiers"]["mix"][tier] - achieved[tier]) <= 0.005, (tier, stage["tiers"], achieved)
        assert not [f for f in stage["flags"] if f["flag"] == "off-target"], stage["flags"]


def test_open_loop_poisson_arrivals_at_batch_8_meet_the_tier_mix(oracle_servers, sample_store, tmp_path):
    """Open loop, Poisson arrivals at 40 requests/s from 2 users, batch 8, one process: the mix is met
    within 0.02 by the oracle's count and reported within 0.005. The pools are twice the closed-loop
    test's: a batch of 8 (up to ~4,000 tokens) flushes a 3,000-token GPU pool, so with other users'
    requests landing between a prime and its measured request, primed keys left the GPU (0.53/0.35/0.13
    met). For the same reason more users in flight drift GPU hits into host hits: 4 users met 0.592 and
    0.598 GPU, 2 users 0.5996 and 0.5998. Warm-up: host hits need keys aged past the GPU; with no
    warm-up (4 users) the first 15 measured requests met no host hit and the mix held from about the
    25th (0.6 s at 40/s); 2 s gives ~80."""
    oracle = oracle_servers(cached_tokens=True, budget_tokens=2 * GPU, host_budget_tokens=2 * HOST)
    start = len(oracle.records())
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", oracle.grpc_url, "--workload", "sessions",
                        "--store", str(sample_store), "--hit-ratios", "0.8", "--batch-sizes", "8",
                        "--arrival", "poisson", "--request-rate", "40", "--stage-seconds", "8",
                        "--warmup-seconds", "2", "--max-history", "256", "--verify-fraction", "0",
                        "--cache-budget-tokens", str(2 * GPU), "--host-budget-tokens", str(2 * HOST),
                        "--tier-mix", "gpu:0.6,host:0.3,miss:0.1", "--offload-mode", "flexkv")
    assert result.returncode == 0, result.stderr[-3000:]
    (b,) = result.report["bins"]
    assert b["requested_rps"] == 40.0 and b["throughput_rps"] == pytest.approx(40.0, rel=0.35), b
    seen = seen_since(oracle, start)
    assert not [e for e in seen if e["violations"]]
    (stage,) = result.report["stages"]
    o = oracle_tiers(read_records(tmp_path), seen)[stage["name"]]
    users = o["gpu"] + o["host"] + o["miss"]
    assert users >= 1000, users
    for tier, share in MIX.items():
        assert abs(o[tier] / users - share) <= 0.02, (tier, o)
        assert abs(stage["tiers"]["mix"][tier] - o[tier] / users) <= 0.005, (tier, stage["tiers"], o)
    assert not [f for f in stage["flags"] if f["flag"] == "off-target"], stage["flags"]
    print(f"open loop {stage['name']}: reported {stage['tiers']['mix']} oracle "
          f"{ {t: round(o[t] / users, 4) for t in MIX} } over {users} users at {b['throughput_rps']:.1f} req/s")


def test_master_and_workers_against_the_reference_targets_two_tiers_meet_the_mix_by_its_own_count(
        batched_step_repository, sample_store, tmp_path):
    """The reference target's host tier in C++ (pools twice the one-process test's), a master and two
    workers of one user each, paced (each worker's model holds half the pools; back to back, a worker
    running faster than the other ages the other's keys out early: 0.606/0.274/0.119 once at batch 4
    on a loaded machine): the mix is met within 0.02 by the server's own HOST_CACHED_TOKENS, and the
    master's tier ratios are what the workers' records of the server's answers add up to."""
    import json

    from tests.conftest import run_distributed, start_server, stop_server

    server = start_server(batched_step_repository, tmp_path / "server.log", "--engine", "batched-aoti",
                          "--frontend", "cpp-backend", "--cache-budget-tokens", str(2 * GPU), "--host-budget-tokens",
                          str(2 * HOST), "--offload-mode", "flexkv", "--threads", "1", ready_timeout=600)
    try:
        code, report_dir, log = run_distributed(
            tmp_path, "--triton-url", server.grpc_url, "--workload", "sessions", "--store", str(sample_store),
            "--hit-ratios", "0.8", "--batch-sizes", "1,4", "--stage-seconds", "8", "--warmup-seconds", "3",
            "--max-history", "256", "--tier-mix", "gpu:0.6,host:0.3,miss:0.1", "--offload-mode", "flexkv",
            "--arrival", "constant", "--request-rate", "100", users=2, workers=2)
    finally:
        stop_server(server)
    assert code == 0, log[-3000:]
    assert "--tier-mix with" not in log  # paced: no warning
    report = json.loads((report_dir / "report.json").read_text())
    assert report["run"]["reports_tiers"] is True and len(report["stages"]) == 2
    records = [r for r in read_records(report_dir) if r["kind"] == "measure" and r["ok"]]
    assert {r["worker"] for r in records} == {0, 1}
    for stage in report["stages"]:
        tiers = stage["tiers"]
        assert tiers["source"] == "observed", tiers
        users = tiers["observed"]["users"]
        assert sum(users.values()) >= 60, users
        for tier, share in MIX.items():
            assert abs(users[tier] / sum(users.values()) - share) <= 0.02, (stage["name"], tier, users)
        # the master's figures are the workers' records merged: the server's word on the wire, summed here
        mine = [r for r in records if r["stage"] == stage["name"]]
        tokens, hits, host = (sum(r[k] for r in mine) for k in ("tokens", "observed_hits", "observed_host_hits"))
        assert tiers["host_ratio"] == pytest.approx(host / tokens, abs=1e-9) and host > 0
        assert tiers["gpu_ratio"] == pytest.approx((hits - host) / tokens, abs=1e-9)
        if stage["batch_size"] == 1:  # one user a record: its tier, classified here from the server's two words
            by_hand = {"gpu": 0, "host": 0, "miss": 0}
            for r in mine:
                by_hand["host" if r["observed_host_hits"] else "gpu" if r["observed_hits"] else "miss"] += 1
            assert by_hand == users
        print(f"distributed, reference target {stage['name']}: mix {tiers['mix']} over {sum(users.values())} "
              f"users (the server's word), {stage['hit_disagreements']} requests the workers' models mispredicted")
