"""A served target with a host tier: per-request tier outputs, the control model and /metrics, worked out by
hand, on every frontend (the C++ backend's tier is its own code, cpp/backend/host_tier.cpp)."""

from __future__ import annotations

import subprocess
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hstu_replay.interface import CONTROL_MODEL, KVCACHE
from hstu_replay.server.serve import CONTROL_OUTPUTS
from tests.conftest import BIN, ROOT, start_server, stop_server
from tests.exposition import exposed
from tests.server.test_serve import infer, prefix, user

pytestmark = pytest.mark.integration

BPT = 2 * 2 * 2 * 32 * 4  # small config, fp32: K and V of 2 layers, 2 heads of 32


def control(client) -> dict[str, int]:
    clear = grpcclient.InferInput("CLEAR", [1], "INT64")
    clear.set_data_from_numpy(np.array([0], dtype=np.int64))
    result = client.infer(CONTROL_MODEL, [clear])
    return {name: int(result.as_numpy(name)[0]) for name in CONTROL_OUTPUTS}


#: frontend -> the batched engine it serves
ENGINES = {"pytriton": "batched", "python-backend": "batched", "cpp-backend": "batched-aoti"}


@pytest.mark.parametrize("frontend", ENGINES)
def test_gpu_hit_host_hit_and_recompute_through_a_real_server(tmp_path, frontend, request):
    # the C++ backend serves the compiled step: the session's repository holds it
    cpp = frontend == "cpp-backend"
    repository = request.getfixturevalue("batched_step_repository") if cpp else tmp_path / "unused-repository"
    # GPU pool 2 pages of 32, host 3 pages, FlexKV offload; 13 items = 32 tokens, 29 items = 64
    server = start_server(repository, tmp_path / "tiers.log", "--engine", ENGINES[frontend],
                          "--config", "small", "--cache-budget-tokens", "64", "--host-budget-tokens", "96",
                          "--offload-mode", "flexkv", "--frontend", frontend, ready_timeout=600 if cpp else 120)
    try:
        c = grpcclient.InferenceServerClient(server.grpc_url)
        people = {uid: user(40 + uid, 29, key=uid) for uid in (1, 2, 3, 4)}
        steps = [  # (key, items) -> CACHED_TOKENS, HOST_CACHED_TOKENS; as tests/server/test_host_tier.py
            ((1, 13), 0, 0), ((2, 13), 0, 0), ((3, 13), 0, 0),
            ((1, 13), 32, 32),  # evicted from the GPU pool by 3, onboarded from the host
            ((4, 13), 0, 0),  # the host evicts 2
            ((2, 13), 0, 0),  # evicted from both: recomputed; the host evicts 3
            ((1, 29), 32, 32),  # 32 onboarded, 32 computed; the host evicts 4 to take 1's 64
            ((1, 29), 64, 0),  # a GPU hit
        ]
        seen = []
        for (key, items), _, _ in steps:
            _, cached, host = infer(c, KVCACHE.model_name, [prefix(people[key], items)],
                                    outputs=("OUTPUT__0", "CACHED_TOKENS", "HOST_CACHED_TOKENS"))
            assert cached.dtype == host.dtype == np.int64
            seen.append((cached.tolist(), host.tolist()))
        assert seen == [([cached], [host]) for _, cached, host in steps]
        figures = control(c)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.cache_metrics}/metrics").read().decode()
        c.close()
    finally:
        code = stop_server(server)
    assert code == 0, (tmp_path / "tiers.log").read_text(errors="replace")[-2000:]
    assert {k: figures[k] for k in ("HIT_TOKENS", "HOST_HIT_TOKENS", "COMPUTED_TOKENS", "EVICTED_USERS",
                                    "RESIDENT_TOKENS", "HOST_RESIDENT_TOKENS", "ONBOARDED_BYTES",
                                    "OFFLOADED_BYTES", "GPU_BUDGET_TOKENS", "HOST_BUDGET_TOKENS", "REQUESTS",
                                    "HOST_EVICTED_USERS", "HOST_RESIDENT_BYTES", "HOST_BUDGET_BYTES")} == {
        "HIT_TOKENS": 128, "HOST_HIT_TOKENS": 64, "COMPUTED_TOKENS": 320 - 128, "EVICTED_USERS": 6,
        "RESIDENT_TOKENS": 64, "HOST_RESIDENT_TOKENS": 96, "ONBOARDED_BYTES": 64 * BPT,
        "OFFLOADED_BYTES": 192 * BPT, "GPU_BUDGET_TOKENS": 64, "HOST_BUDGET_TOKENS": 96, "REQUESTS": 8,
        "HOST_EVICTED_USERS": 3, "HOST_RESIDENT_BYTES": 96 * BPT, "HOST_BUDGET_BYTES": 96 * BPT}
    assert figures["ONBOARD_MICROS"] > 0 and figures["OFFLOAD_MICROS"] > 0
    # the pool took memory for one full request (8 users of 17 pages), not its whole size (2 + 136 pages)
    page = 32 * BPT
    assert (figures["RESIDENT_BYTES"], figures["BUDGET_BYTES"]) == (136 * page, 138 * page)
    values = exposed(metrics)
    assert int(values["hstu_kvcache_host_hit_tokens_total"]) == 64
    assert int(values["hstu_kvcache_hit_tokens_total"]) == 128
    assert int(values["hstu_kvcache_onboarded_bytes_total"]) == 64 * BPT
    assert int(values["hstu_kvcache_offloaded_bytes_total"]) == 192 * BPT
    assert int(values["hstu_kvcache_onboard_micros_total"]) == figures["ONBOARD_MICROS"]
    assert int(values["hstu_kvcache_host_resident_tokens"]) == 96
    assert int(values["hstu_kvcache_host_budget_tokens"]) == 96
    assert int(values["hstu_kvcache_resident_bytes"]) == 136 * page
    assert int(values["hstu_kvcache_budget_bytes"]) == 138 * page
    assert int(values["hstu_kvcache_host_evicted_users_total"]) == 3
    assert int(values["hstu_kvcache_host_resident_bytes"]) == 96 * BPT


def test_a_bad_host_budget_is_one_line_and_exit_2():
    done = subprocess.run([str(BIN / "hstu-replay"), "server", "serve", "--engine", "batched",
                           "--host-budget-tokens", "-5", "--device", "cpu"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "hstu-replay: error: --host-budget-tokens -5: use 0 (no host tier) or a positive count"]
