"""Compiled packages agree with the eager model. Each package is compiled once for this module."""

import time

import numpy as np
import pytest
import torch

from hstu_replay.errors import InputError
from hstu_replay.request import UserRequest, build_request
from hstu_replay.server.aoti import (
    SHARED_RUNTIME, export_nocache_package, export_package, load_nocache_package, load_package, runtime_link_options,
)
from hstu_replay.server.model_config import get_config
from hstu_replay.server.engine import RankingEngine
from hstu_replay.server.kvcache import KVCache
from hstu_replay.server.model import EagerCompute, build_model

SMALL = get_config("small")
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return build_model(SMALL, seed=3)


@pytest.fixture(scope="module")
def kv_package(model, tmp_path_factory):
    info = export_package(model, SMALL, tmp_path_factory.mktemp("aoti") / "kv.pt2")
    assert info.path.is_file() and info.compile_seconds < 120
    return info.path


@pytest.fixture(scope="module")
def nocache_package(model, tmp_path_factory):
    info = export_nocache_package(model, SMALL, tmp_path_factory.mktemp("aoti") / "nocache.pt2")
    return info.path


def empty():
    return torch.zeros(SMALL.num_layers, 0, SMALL.num_heads, SMALL.head_dim)


def make_user(uid, hist, cand):
    rng = np.random.default_rng(uid)
    items = rng.integers(0, 1 << 40, hist + cand, dtype=np.int64)
    return UserRequest(uid, (1, 2, 3, 4, 5), items[:hist], rng.integers(0, 256, hist, dtype=np.int64), items[hist:])


@pytest.mark.integration  # compiles AOTInductor packages (about 40 s on a CPU)
def test_package_loads_fast_and_matches_eager_cold_and_warm(model, kv_package):
    started = time.perf_counter()
    compiled = load_package(kv_package)
    assert time.perf_counter() - started < 1.0
    eager = EagerCompute(model)
    gen = torch.Generator().manual_seed(0)
    hist, cands = torch.randint(0, 1 << 40, (6 + 2 * 40,), generator=gen), torch.randint(0, 1 << 40, (7,), generator=gen)
    # (cached tokens, candidates): cold, 1 cached token, warm, fully cached, 1 and 0 candidates
    for split, n_cand in [(0, 7), (1, 7), (0, 1), (30, 7), (85, 2), (86, 7), (86, 1), (40, 0)]:
        _, pk, pv = eager(hist[:split], cands[:1], empty(), empty())
        want = eager(hist[split:], cands[:n_cand], pk, pv)
        got = compiled(hist[split:], cands[:n_cand], pk, pv)
        for w, g in zip(want, got):
            assert w.shape == g.shape
            np.testing.assert_allclose(g.numpy(), w.numpy(), atol=ATOL, rtol=0)


@pytest.mark.integration  # compiles AOTInductor packages (about 40 s on a CPU)
def test_engine_on_the_package_equals_engine_on_eager(model, kv_package):
    engines = [RankingEngine(SMALL, c, KVCache(1 << 16)) for c in (EagerCompute(model), load_package(kv_package))]
    rounds = [[make_user(1, 10, 3), make_user(2, 0, 1)], [make_user(1, 30, 2), make_user(2, 0, 4), make_user(3, 5, 1)]]
    for users in rounds:
        eager, compiled = (e.infer(build_request(users)) for e in engines)
        np.testing.assert_allclose(compiled.logits, eager.logits, atol=ATOL, rtol=0)
        assert compiled.cached_tokens.tolist() == eager.cached_tokens.tolist()
    assert compiled.cached_tokens.tolist() == [26, 6, 0]


@pytest.mark.parametrize("shape", [[(0, 1)], [(12, 3)], [(4, 2), (0, 5), (40, 1)], [(b, 1 + b % 3) for b in range(8)]])
@pytest.mark.integration  # compiles AOTInductor packages (about 40 s on a CPU)
def test_nocache_package_serves_the_published_interface(model, nocache_package, shape):
    users = [make_user(10 + b, hist, cand) for b, (hist, cand) in enumerate(shape)]
    request = build_request(users)
    want = RankingEngine(SMALL, EagerCompute(model), None).infer(request).logits
    got = load_nocache_package(nocache_package)(
        *(torch.from_numpy(t) for t in (request.values, request.lengths, request.num_candidates))
    )
    assert got.shape == want.shape
    np.testing.assert_allclose(got.numpy(), want, atol=ATOL, rtol=0)


def test_missing_or_bad_package_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="no AOTInductor package"):
        load_package(tmp_path / "absent.pt2")
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="cannot load"):
        load_package(tmp_path / "junk.pt2")


def fake_compiler(tmp_path, answer: str):
    script = tmp_path / "cxx"
    script.write_text(f"#!/bin/sh\necho '{answer}'\n")
    script.chmod(0o755)
    return str(script)


def test_a_compiler_without_a_shared_libstdcxx_gets_the_runtime_named(tmp_path):
    # g++ prints the bare name when it finds no such file: the static archive would be linked
    assert runtime_link_options(fake_compiler(tmp_path, "libstdc++.so")) == {
        "aot_inductor.custom_op_libs": [SHARED_RUNTIME]}
    assert runtime_link_options(fake_compiler(tmp_path, str(tmp_path / "missing" / "libstdc++.so"))) != {}


def test_a_compiler_with_its_shared_libstdcxx_is_left_alone(tmp_path):
    found = tmp_path / "libstdc++.so"
    found.write_text("")
    assert runtime_link_options(fake_compiler(tmp_path, str(found))) == {}
    assert runtime_link_options(fake_compiler(tmp_path, str(found)), force=True) != {}


def test_a_nocache_package_takes_its_inputs_to_its_own_device(nocache_package):
    assert load_nocache_package(nocache_package).device == torch.device("cpu")  # compiled here for the CPU
