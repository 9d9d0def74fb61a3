"""`hstu-replay protocol run` against the real target on this machine's CPU (small config).

Its figures are checked against what the server itself counted (Triton's statistics, the KV
cache's Prometheus counter of reused tokens), against what the dump files imply, and against a
wall clock around the whole command.
"""

import json
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hstu_replay.dumps.reader import read_dump
from hstu_replay.process import free_ports
from tests.conftest import BIN, ROOT

pytestmark = pytest.mark.integration

MODELS = ("hstu_model", "hstu_gr_ranking", "hstu_gr_ranking_kvcache")
SLEEP_S = 0.2


def _server_counts(url: str) -> dict[str, tuple[int, int]]:
    """model -> (successful requests, their summed server-side ns), read by the test itself."""
    client = grpcclient.InferenceServerClient(url)
    try:
        out = {}
        for model in MODELS:
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
            success = stats.get("success", {})
            out[model] = (int(success.get("count", 0)), int(success.get("ns", 0)))
        return out
    finally:
        client.close()


def _hit_tokens(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    values = dict(line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return int(float(values["hstu_kvcache_hit_tokens_total"]))


def _protocol(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "hstu-replay"), "protocol", "run", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_protocol_figures_agree_with_the_server_and_the_wall_clock(triton_server, reference_dumps, tmp_path):
    # what the dump implies, worked out here: 48 users in dump order, their history tokens
    history = np.concatenate([b.tensors["total_history_lengths"] for b in read_dump(reference_dumps)])
    users = len(history)
    assert users == 48
    measured = {b: users // b - 1 for b in (1, 2, 4, 8)}  # calls per pass: every case but the warm-up
    expected_calls = {"hstu_model": 1 + 3 * measured[2], "hstu_gr_ranking": 1 + 3 * measured[2],
                      "hstu_gr_ranking_kvcache": sum(1 + 2 * measured[b] for b in (1, 2, 4, 8))}
    # pass 2 reuses every history token of the measured users; the warm-up and pass 1 reuse none
    expected_hits = sum(int(history[b:(users // b) * b].sum()) for b in (1, 2, 4, 8))

    before, hits_before = _server_counts(triton_server.grpc_url), _hit_tokens(triton_server.ports.cache_metrics)
    start = time.perf_counter()
    result = _protocol("--triton-url", triton_server.grpc_url, "--dump-dir", str(reference_dumps),
                       "--batch-sizes", "1,2,4,8", "--sleep", str(SLEEP_S), "--hardware", "test CPU",
                       "--out", str(tmp_path / "out"))
    outer_s = time.perf_counter() - start
    after, hits_after = _server_counts(triton_server.grpc_url), _hit_tokens(triton_server.ports.cache_metrics)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads((tmp_path / "out" / "protocol.json").read_text())
    assert report["run"]["complete"] is True
    passes = report["passes"]
    # the server saw exactly the calls the protocol implies: one warm-up per run, then the passes
    for model in MODELS:
        assert after[model][0] - before[model][0] == expected_calls[model], model
    assert hits_after - hits_before == expected_hits
    for p in passes:
        assert p["calls"] == measured[p["batch_size"]] and p["server_calls"] == p["calls"]
        assert p["ms_per_logical_request"] == pytest.approx(p["e2e_s"] * 1e3 / (p["calls"] * p["batch_size"]))
        assert 0 < p["wire_s"] <= p["e2e_s"]
        if p["model"] == "hstu_gr_ranking_kvcache":
            assert p["cached_fraction"] == (1.0 if p["pass"] == "cached" else 0.0)
            # every answer checked against the dump; the cached pass also against pass 1
            assert p["verified"] == p["calls"] * (2 if p["pass"] == "cached" else 1) and p["mismatches"] == 0
    # no flag about what was measured (one about unsteady repeats depends on this shared machine's load)
    assert [f for f in report["flags"] if "repeated passes" not in f] == []
    # time: the passes and the sleeps fit inside the command's wall clock, and the server's own time
    # for every request (warm-ups included) fits inside it too
    runs = 3 + 3  # hstu_model, hstu_gr_ranking and the KV-cache model at batches 1, 2 (shared), 4, 8
    passes_s = sum(p["e2e_s"] for p in passes)
    assert passes_s + runs * SLEEP_S < outer_s
    server_s = sum(after[m][1] - before[m][1] for m in MODELS) / 1e9
    assert 0 < server_s < outer_s - runs * SLEEP_S

    rows = {r["label"]: r for r in report["backend_comparison"]["rows"]}
    assert len(rows) == 4 and report["backend_comparison"]["batch_size"] == 2
    hit = rows["KV-cache model, pass 2 (all cached)"]
    assert hit["nvidia"]["e2e_s"] == 0.804 and hit["ours"]["speedup_vs_no_cache"] > 1.0
    assert [r["batch_size"] for r in report["batch_scaling"]["rows"]] == [1, 2, 4, 8]
    assert "Backend comparison, batch 2" in result.stdout and "NVIDIA RTX PRO 6000 Blackwell" in result.stdout
    page = (tmp_path / "out" / "protocol.html").read_text()
    assert "test CPU" in page and "RTX PRO 6000 Blackwell" in page


def test_a_killed_run_keeps_what_it_measured(triton_server, reference_dumps, tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen([str(BIN / "hstu-replay"), "protocol", "run", "--triton-url", triton_server.grpc_url,
                                "--dump-dir", str(reference_dumps), "--sleep", "0.2", "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 240
        while not (out / "protocol.json").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        process.kill()
    finally:
        process.wait(30)
    settled = None  # the server finishes the request in flight: wait until it has, for the tests after
    while (counts := _server_counts(triton_server.grpc_url)) != settled:
        settled = counts
        time.sleep(1.0)
    report = json.loads((out / "protocol.json").read_text())
    assert report["run"]["complete"] is False  # written after the first run, before the last
    assert {p["model"] for p in report["passes"]} == {"hstu_model"}
    assert [p["pass"] for p in report["passes"]] == ["repeat 1", "repeat 2", "repeat 3"]
    assert "Backend comparison" in (out / "protocol.html").read_text()


@pytest.mark.parametrize("args, message", [
    ([], "give exactly one of --dump-dir DIR or --store STORE"),
    (["--batch-sizes", "1,9"], "--batch-sizes '9': use a whole number of users in 1..8"),
    (["--models", "hstu_model,nope"], "--models 'hstu_model,nope'"),
    (["--cases", "30"], "batch size 2: 48 users make 24 cases; the protocol needs 31"),
    (["--sleep", "soon"], "--sleep 'soon': expected a number"),
    (["--unreachable"], "cannot read model"),
])
def test_bad_input_is_one_line_exit_2_before_any_load(triton_server, reference_dumps, args, message):
    url = triton_server.grpc_url
    if args == ["--unreachable"]:
        args, url = [], f"127.0.0.1:{free_ports(1)[0]}"
    source = [] if args == [] and message.startswith("give") else ["--dump-dir", str(reference_dumps)]
    before = _server_counts(triton_server.grpc_url)
    result = _protocol("--triton-url", url, *source, *args, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hstu-replay: error: ") and message in lines[0], lines
    assert _server_counts(triton_server.grpc_url) == before  # nothing was sent


def test_missing_dump_directory(tmp_path):
    result = _protocol("--dump-dir", str(tmp_path / "none"), timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"hstu-replay: error: {tmp_path / 'none'}: no such dump directory"
