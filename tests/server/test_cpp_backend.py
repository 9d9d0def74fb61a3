"""`server serve --frontend cpp-backend`: our C++ Triton backend on a real tritonserver, driven by our own client.

Answers are checked against the per-user eager model (`model.EagerCompute`, another code path than the
batched step the backend runs), hits against the independent oracle's caches (`tests/oracle/server.py`),
one tier and two.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.errors import ServerError
from hstu_replay.inspection import descendants, mapped_paths
from hstu_replay.interface import CONTROL_MODEL, KVCACHE, NOCACHE, PYTHON_BACKEND, Limits
from hstu_replay.request import build_request
from hstu_replay.server.cpp_backend import BACKEND_NAME, config_text, parameters, CppBackendSettings
from hstu_replay.server.engine import RankingEngine
from hstu_replay.server.model import EagerCompute, build_model
from hstu_replay.server.model_config import get_config
from hstu_replay.server.python_backend import model_entries
from hstu_replay.server.serve import CONTROL_OUTPUTS
from hstu_replay.verify import DEFAULT_TOLERANCE
from tests.conftest import MACHINE_LENIENT, ROOT, run_locust, start_server, stop_server
from tests.exposition import exposed
from tests.oracle.server import OracleCache, TwoTierCache
from tests.server.test_serve import prefix, user

CONFIG = get_config("small")
BUDGET_TOKENS = 65_536
SMALL_BUDGET_TOKENS = 480  # 15 pages: a few small users fill it, and one of 250 items (16 pages) exceeds it
PAGE_TOKENS = 32
#: CPU fp32: the batched step and the eager model differ by summation order alone. (DEFAULT_TOLERANCE,
#: bf16's, cannot tell wrong cached K/V here: another history moves the small model's logits by ~0.03.)
ATOL = 1e-4
HOST_BUDGET_TOKENS, OFFLOAD_CHUNK_TOKENS = 640, 64  # behind the small pool: 20 pages, native offload
SETTINGS = CppBackendSettings(config=CONFIG, package=Path("/repo/step.pt2"), cache_budget_tokens=BUDGET_TOKENS,
                              page_tokens=PAGE_TOKENS)


def test_every_model_names_our_backend_with_its_published_tensors_and_its_role():
    texts = {entry.name: config_text(entry, parameters(entry, SETTINGS)) for entry in model_entries()}
    assert set(texts) == {KVCACHE.model_name, NOCACHE.model_name, PYTHON_BACKEND.model_name, CONTROL_MODEL}
    for name, text in texts.items():
        assert f'backend: "{BACKEND_NAME}"' in text and "max_batch_size: 0" in text
        role = re.search(r'key: "role" value: \{ string_value: "(\w+)" \}', text).group(1)
        assert role == {KVCACHE.model_name: "cached", CONTROL_MODEL: "control"}.get(name, "uncached")
    kv = texts[KVCACHE.model_name]
    for tensor in ("INPUT__4", "OUTPUT__1", "CACHED_TOKENS", "HOST_CACHED_TOKENS"):
        assert f'name: "{tensor}"' in kv
    assert 'string_value: "values=INPUT__0,lengths=INPUT__1,num_candidates=INPUT__2,user_ids=INPUT__3,' \
           'total_history_lengths=INPUT__4"' in kv
    assert 'key: "host_budget_tokens" value: { string_value: "0" }' in kv  # the cached model's alone
    assert "host_budget_tokens" not in texts[NOCACHE.model_name]
    assert 'key: "reserve_pool" value: { string_value: "0" }' in kv and "reserve_pool" not in texts[NOCACHE.model_name]
    (cached,) = [entry for entry in model_entries() if entry.name == KVCACHE.model_name]
    assert parameters(cached, replace(SETTINGS, reserve_pool=True))["reserve_pool"] == "1"
    # the small config's limits, published for clients (8 users of 6 + 2 x (256 + 32) values)
    published = {"hstu_max_batch": "8", "hstu_max_values": "4656", "hstu_max_candidates": "32",
                 "hstu_max_history_items": "256"}
    for entry in model_entries():
        values = parameters(entry, SETTINGS)
        assert {k: values.get(k) for k in published} == (published if entry.name != CONTROL_MODEL
                                                         else dict.fromkeys(published))
        assert not set(published) & set(parameters(entry, SETTINGS, publish_limits=False))
    assert f'string_value: "{",".join(CONTROL_OUTPUTS)}"' in texts[CONTROL_MODEL]
    assert "values=TOKENS" in texts[PYTHON_BACKEND.model_name] and "user_ids=USER_IDS" in texts[PYTHON_BACKEND.model_name]


def serve_command(*extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hstu_replay.cli", "server", "serve", "--repository", "/nonexistent",
                           "--config", "small", "--frontend", "cpp-backend", *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("extra, says", [
    (("--engine", "batched"), "--frontend cpp-backend serves --engine batched-aoti only"),
    (("--host-budget-tokens", "-5"), "--host-budget-tokens -5: use 0 (no host tier) or a positive count"),
])
def test_what_the_cpp_backend_cannot_serve_is_refused_in_one_line(extra, says):
    proc = serve_command(*extra)
    assert proc.returncode == 2
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def serving(repository: Path, log: Path, budget_tokens: int, *extra: str):
    server = start_server(repository, log, "--frontend", "cpp-backend", "--engine", "batched-aoti",
                          "--config", "small", "--cache-budget-tokens", str(budget_tokens), *extra, ready_timeout=600)
    yield server, log
    code = stop_server(server)  # also: tritonserver and every port gone
    assert code == 0, log.read_text(errors="replace")[-2000:]


@pytest.fixture(scope="module")
def cpp_server(batched_step_repository, tmp_path_factory):
    yield from serving(batched_step_repository, tmp_path_factory.mktemp("cpp-backend") / "server.log", BUDGET_TOKENS)


@pytest.fixture(scope="module")
def small_cpp_server(batched_step_repository, tmp_path_factory):
    yield from serving(batched_step_repository, tmp_path_factory.mktemp("cpp-small") / "server.log",
                       SMALL_BUDGET_TOKENS)


@pytest.fixture(scope="module")
def reserved_cpp_server(batched_step_repository, tmp_path_factory):
    yield from serving(batched_step_repository, tmp_path_factory.mktemp("cpp-reserved") / "server.log",
                       SMALL_BUDGET_TOKENS, "--reserve-pool")


TIERS = ("--host-budget-tokens", str(HOST_BUDGET_TOKENS), "--offload-mode", "native", "--offload-chunk-tokens",
         str(OFFLOAD_CHUNK_TOKENS))


@pytest.fixture(scope="module")
def tiered_cpp_server(batched_step_repository, tmp_path_factory):
    yield from serving(batched_step_repository, tmp_path_factory.mktemp("cpp-tiers") / "server.log",
                       SMALL_BUDGET_TOKENS, *TIERS)


@pytest.fixture(scope="module")
def eager():
    """The per-user eager model, cold every time: what every answer must be."""
    engine = RankingEngine(CONFIG, EagerCompute(build_model(CONFIG, 0)), None)
    return lambda users: engine.infer(build_request(users)).logits


def connect(server, model: str = KVCACHE.model_name) -> TritonClient:
    client = TritonClient(ClientOptions(url=server.grpc_url, model=model))
    client.connect()
    return client


@pytest.mark.integration
def test_no_python_runs_in_the_serving_process(cpp_server):
    server, _ = cpp_server
    (triton,) = [pid for pid in descendants(server.pid) if psutil.Process(pid).name() == "tritonserver"]
    libraries = {Path(path).name for path in mapped_paths(triton)}
    assert f"libtriton_{BACKEND_NAME}.so" in libraries and "libtorch_cpu.so" in libraries
    # the package's attention is the backend's C++ operator: no interpreter is loaded
    assert not [name for name in libraries if name.startswith("libpython")], libraries


def answers_are_the_eager_models(server, eager, base_key: int, atol: float) -> None:
    """Cold, partly cached and fully cached users (one of a single candidate) against the eager model,
    on every ranking model of the server."""
    client = connect(server)
    try:
        users = [user(71, 120, key=base_key), user(72, 40, cand=9, key=base_key + 1),
                 user(73, 3, cand=1, key=base_key + 2)]
        cold = client.infer(build_request([prefix(users[0], 20), *users[1:]]))
        np.testing.assert_allclose(cold.logits, eager([prefix(users[0], 20), *users[1:]]), atol=atol,
                                   rtol=0)
        partly = client.infer(build_request(users))  # user 71 extends 20 items to 120; the others held in full
        assert partly.cached_tokens.tolist() == [6 + 2 * 20, 6 + 2 * 40, 6 + 2 * 3]
        full = client.infer(build_request(users))
        assert full.cached_tokens.tolist() == [6 + 2 * 120, 6 + 2 * 40, 6 + 2 * 3]
        expected = eager(users)
        for answer in (partly, full):
            np.testing.assert_allclose(answer.logits, expected, atol=atol, rtol=0)
        for model in (NOCACHE.model_name, PYTHON_BACKEND.model_name):
            other = connect(server, model)
            try:
                np.testing.assert_allclose(other.infer(build_request(users)).logits, expected,
                                           atol=atol, rtol=0)
            finally:
                other.close()
    finally:
        client.close()


@pytest.mark.integration
def test_logits_cold_partly_and_fully_cached_are_the_eager_models(cpp_server, eager):
    answers_are_the_eager_models(cpp_server[0], eager, 7_100, ATOL)


@pytest.mark.integration
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU package carries the Triton kernel: needs a GPU")
def test_on_a_gpu_the_backend_serves_the_package_with_its_kernel_and_answers_as_eager(tmp_path, eager, monkeypatch):
    monkeypatch.setenv("HSTU_REPLAY_BACKEND_PHASES", "1")  # a phase line per call: it names the path each took
    repository = tmp_path / "repository"  # the small config's batched step compiled for the GPU here (a minute)
    monkeypatch.delenv("HSTU_REPLAY_CUDA_GRAPHS", raising=False)  # by default every step launches its kernels
    plain_log = tmp_path / "plain.log"
    for server, _ in serving(repository, plain_log, BUDGET_TOKENS, "--device", "cuda"):
        answers_are_the_eager_models(server, eager, 7_500, DEFAULT_TOLERANCE)
        assert list(repository.rglob("*cuda*.pt2"))
    log = plain_log.read_text(errors="replace")
    assert "engine.step" in log and "engine.graph" not in log, log[-2000:]
    monkeypatch.setenv("HSTU_REPLAY_CUDA_GRAPHS", "1")  # asked for: fully cached steps replayed as graphs
    graphs_log = tmp_path / "graphs.log"
    for server, _ in serving(repository, graphs_log, BUDGET_TOKENS, "--device", "cuda"):
        answers_are_the_eager_models(server, eager, 7_500, DEFAULT_TOLERANCE)
        replayed_graphs_answer_as_eager(server, eager, 7_600)
    log = graphs_log.read_text(errors="replace")
    assert "engine.graph" in log and "CUDA graphs off" not in log, log[-2000:]


def replayed_graphs_answer_as_eager(server, eager, base_key: int) -> None:
    """Fully cached requests replayed as CUDA graphs: two shapes, each captured then replayed, and
    again after the pool has grown under them (a graph holding the old pool's addresses would read
    freed memory)."""
    client = connect(server)
    try:
        held = [user(80 + i, 100 + 10 * i, cand=3 + i, key=base_key + i) for i in range(3)]
        client.infer(build_request(held))
        shapes = [held, held[:1]]
        for users in shapes * 2:
            np.testing.assert_allclose(client.infer(build_request(users)).logits, eager(users),
                                       atol=DEFAULT_TOLERANCE, rtol=0)
        before = control_stats(server)["RESIDENT_BYTES"]
        for batch in range(40):  # users of 120 items (8 pages each) until the pool has grown
            client.infer(build_request([user(90 + i, 120, key=base_key + 100 + CONFIG.max_batch * batch + i)
                                        for i in range(CONFIG.max_batch)]))
            if control_stats(server)["RESIDENT_BYTES"] > before:
                break
        assert control_stats(server)["RESIDENT_BYTES"] > before
        for users in shapes:
            answer = client.infer(build_request(users))
            assert answer.cached_tokens.tolist() == [6 + 2 * len(u.history_items) for u in users]
            np.testing.assert_allclose(answer.logits, eager(users), atol=DEFAULT_TOLERANCE, rtol=0)
    finally:
        client.close()


def growing_requests(seed: int, keys: list[int], steps: int, growth: int):
    """Requests of one to three of `keys`, each user's history grown by under `growth` items (to at
    most 100), each a prefix of one fixed history: what a key holds is always a prefix of what it sends."""
    rng = np.random.default_rng(seed)
    lengths = dict.fromkeys(keys, 0)
    for _ in range(steps):
        chosen = [int(k) for k in rng.choice(keys, size=int(rng.integers(1, 4)), replace=False)]
        for key in chosen:
            lengths[key] = min(100, lengths[key] + int(rng.integers(0, growth)))
        yield [prefix(user(key % 100, 100, cand=int(rng.integers(1, 5)), key=key), lengths[key]) for key in chosen]


@pytest.mark.integration
@pytest.mark.parametrize("pool", ["small_cpp_server", "reserved_cpp_server"])
def test_hits_are_the_oracles_through_growth_eviction_and_a_user_beyond_the_budget(pool, request):
    server, _ = request.getfixturevalue(pool)
    client = connect(server)
    oracle = OracleCache(SMALL_BUDGET_TOKENS, PAGE_TOKENS)
    page_bytes = 2 * PAGE_TOKENS * CONFIG.num_layers * CONFIG.num_heads * CONFIG.head_dim * 4  # K and V, fp32
    request_pages = CONFIG.max_batch * -(-(6 + 2 * CONFIG.max_history) // PAGE_TOKENS)  # users of the longest history
    full = (SMALL_BUDGET_TOKENS // PAGE_TOKENS + request_pages) * page_bytes  # the budget's pages and one request's
    try:
        start = clear_cache(server)["RESIDENT_BYTES"]
        for step, users in enumerate(growing_requests(3, [8_000 + k for k in range(6)], 24, 15)):
            if step == 12:  # longer than the whole budget: served, never kept
                users.append(user(9, 250, key=8_999))
            answer = client.infer(build_request(users))
            assert answer.cached_tokens.tolist() == oracle.apply([u.key for u in users],
                                                                 [u.total_history_length for u in users]), step
        stats = control_stats(server)
        assert stats["RESIDENT_TOKENS"] == sum(oracle.held.values())
        assert stats["EVICTED_USERS"] > 0 and stats["REQUESTS"] == 24
        assert stats["BUDGET_BYTES"] == full
        if pool == "reserved_cpp_server":  # taken whole at start, never grown
            assert start == stats["RESIDENT_BYTES"] == full
        else:  # one full request's pages at start, taken as used after that
            assert start == request_pages * page_bytes and start <= stats["RESIDENT_BYTES"] <= full
    finally:
        client.close()


@pytest.mark.integration
def test_two_tiers_hits_onboarding_and_answers_are_the_oracles(tiered_cpp_server, eager):
    two_tiers_are_the_oracles(tiered_cpp_server[0], eager, ATOL)


@pytest.mark.integration
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a host tier behind a GPU pool: needs a GPU")
def test_on_a_gpu_the_host_tier_offloads_and_onboards_through_pinned_memory(tmp_path, eager):
    for server, _ in serving(tmp_path / "repository", tmp_path / "server.log", SMALL_BUDGET_TOKENS, "--device", "cuda",
                             *TIERS):
        two_tiers_are_the_oracles(server, eager, DEFAULT_TOLERANCE)


def two_tiers_are_the_oracles(server, eager, atol: float) -> None:
    """Users evicted from the pool come back from the host tier (onboarded into their pages), are
    evicted from both and recomputed; every hit is the two-tier oracle's and every answer the eager
    model's, so what was onboarded is the K/V the user had."""
    client = connect(server)
    oracle = TwoTierCache(SMALL_BUDGET_TOKENS, HOST_BUDGET_TOKENS, PAGE_TOKENS, "native", OFFLOAD_CHUNK_TOKENS)
    try:
        clear_cache(server)
        for step, users in enumerate(growing_requests(11, [8_100 + k for k in range(9)], 40, 40)):
            answer = client.infer(build_request(users))
            hits = oracle.apply([u.key for u in users], [u.total_history_length for u in users])
            assert (answer.cached_tokens.tolist(), answer.host_cached_tokens.tolist()) == (
                hits, oracle.last_host_hits), step
            np.testing.assert_allclose(answer.logits, eager(users), atol=atol, rtol=0)
        stats = control_stats(server)
        assert stats["RESIDENT_TOKENS"] == sum(oracle.gpu.held.values())
        assert stats["HOST_RESIDENT_TOKENS"] == sum(oracle.host.held.values())
        assert stats["HOST_HIT_TOKENS"] > 0 and stats["HOST_EVICTED_USERS"] > 0 and stats["EVICTED_USERS"] > 0
        assert stats["HOST_BUDGET_TOKENS"] == HOST_BUDGET_TOKENS and stats["REQUESTS"] == 40
    finally:
        client.close()


@pytest.mark.integration
def test_a_user_onboarded_into_pages_another_user_overwrote_answers_as_eager(tiered_cpp_server, eager):
    server, _ = tiered_cpp_server
    client = connect(server)
    a, b, c = (user(61 + i, 100, key=8_300 + i) for i in range(3))  # 206 tokens: 7 pages each
    try:
        clear_cache(server)
        for users in ([a], [b], [c]):  # c evicts a from the pool (15 pages) and computes in a's freed pages
            assert client.infer(build_request(users)).cached_tokens.tolist() == [0]
        back = client.infer(build_request([a]))  # the host holds 3 chunks of 64 of a: onboarded, 14 computed
        assert (back.cached_tokens.tolist(), back.host_cached_tokens.tolist()) == ([192], [192])
        np.testing.assert_allclose(back.logits, eager([a]), atol=ATOL, rtol=0)
    finally:
        client.close()


def clear_cache(server, clear: int = 1) -> dict[str, int]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        value = grpcclient.InferInput("CLEAR", [1], "INT64")
        value.set_data_from_numpy(np.array([clear], dtype=np.int64))
        result = client.infer(CONTROL_MODEL, [value])
        return {name: int(result.as_numpy(name)[0]) for name in CONTROL_OUTPUTS}
    finally:
        client.close()


def control_stats(server) -> dict[str, int]:
    return clear_cache(server, 0)


@pytest.mark.integration
def test_requests_beyond_the_published_limits_are_refused_and_the_server_stays(cpp_server):
    server, _ = cpp_server
    client = connect(server)
    wide = Limits(max_batch=CONFIG.max_batch + 1, max_history=CONFIG.max_history + 10)
    try:
        client.infer(build_request([user(41, 40, key=9_400)]))
        refusals = [
            ([user(60 + i, 2, key=9_600 + i) for i in range(CONFIG.max_batch + 1)], "batch of 9 users"),
            ([user(42, CONFIG.max_history + 1, key=9_420)], "history of 257 items exceeds 256"),
            ([prefix(user(41, 40, key=9_400), 5)], "shorter than the 86 held"),
        ]
        for users, says in refusals:
            with pytest.raises(ServerError, match=says):
                client.infer(build_request(users, wide))
        twice = build_request([user(43, 4, key=9_430), user(44, 4, key=9_440)])
        twice = type(twice).of(twice.values, twice.lengths, twice.num_candidates, np.array([9_430, 9_430]),
                               twice.total_history_lengths)
        with pytest.raises(ServerError, match="appears twice in one request"):
            client.infer(twice)
        assert client.infer(build_request([user(41, 45, key=9_400)])).cached_tokens.tolist() == [86]
    finally:
        client.close()


@pytest.mark.integration
def test_the_control_model_and_the_metrics_port_read_and_empty_the_cache(cpp_server):
    server, _ = cpp_server
    client = connect(server)
    try:
        client.infer(build_request([user(51, 30, key=9_510)]))
        assert client.infer(build_request([user(51, 30, key=9_510)])).cached_tokens.tolist() == [66]
        stats = control_stats(server)
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.cache_metrics}/metrics").read().decode()
        values = exposed(text)
        assert int(values["hstu_kvcache_hit_tokens_total"]) == stats["HIT_TOKENS"] > 0
        assert 0 < stats["RESIDENT_BYTES"] <= stats["BUDGET_BYTES"]
        assert stats["GPU_BUDGET_TOKENS"] == BUDGET_TOKENS and stats["HOST_BUDGET_TOKENS"] == 0
        assert clear_cache(server)["RESIDENT_TOKENS"] == 0
        assert client.infer(build_request([user(51, 30, key=9_510)])).cached_tokens.tolist() == [0]
    finally:
        client.close()


@pytest.mark.integration
def test_locust_replays_the_reference_dumps_through_the_cpp_backend(cpp_server, reference_dumps, tmp_path):
    server, _ = cpp_server
    result = run_locust(
        tmp_path / "report", "-u", "1", "-r", "1", "--triton-url", server.grpc_url, "--workload", "dumps",
        "--dump-dir", str(reference_dumps), "--hit-ratios", "0,1.0", "--batch-sizes", "8",
        "--stage-seconds", "3", "--warmup-seconds", "1", "--max-mismatches", "0",
        # client and server share two cores, and this server answers in milliseconds: the client's loop
        # lags; what is checked here is the answers and the hits, not who bounded the rate
        *MACHINE_LENIENT,
    )
    assert result.violations_but_the_machines() == []
    report = result.report
    # --max-history left out: the model's published limits cap it (8 users of 6 + 2 x (256 + 32) values)
    assert report["run"]["server_limits"] == {
        "published": {"max_batch": 8, "max_values": 4656, "max_candidates": 32, "max_history": 256},
        "caps": [{"option": "--max-history", "asked": 4096, "used": 256},
                 {"option": "--max-values", "asked": 40_000, "used": 4656}]}
    assert report["verification"]["mismatches"] == 0  # the compiled no-cache package's logits, from the dumps
    assert report["verification"]["verified"] > 0
    for stage in report["stages"]:
        assert stage["requests"] > 0 and stage["hit_disagreements"] == 0, stage
        assert stage["observed_ratio"] == pytest.approx(stage["predicted_ratio"]), stage

