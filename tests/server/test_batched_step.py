"""The batched forward pass compiled by AOTInductor (`--engine batched-aoti`) against the per-user engine.

The per-user engine (eager `model.HSTUModel`, dense attention over each user's own K/V) is the
oracle: it shares neither the page pool, the work plan nor the attention with the package. A
fully cached request after a cold one reads back only what the package wrote into the pool, so it
checks the in-place writes as well.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hstu_replay.interface import history_tokens
from hstu_replay.server.aoti import export_batched_step, load_batched_step
from hstu_replay.server.batched import build_batched_engine
from hstu_replay.server.build import ENGINE_KINDS, batched_step_path
from hstu_replay.server.model import build_model
from tests.server.test_batched import SMALL, both, per_user, pool_is_consistent, tiers
from tests.server.test_engine import make_user, prefix, serve


@pytest.fixture(scope="module")
def engines(batched_step_repository):
    built = ENGINE_KINDS["batched-aoti"](batched_step_repository, SMALL, 0, 1 << 13, 32, "cpu")
    return per_user(), built.cached


def test_the_package_is_the_one_the_repository_holds(engines, batched_step_repository):
    package = engines[1].forward_step
    assert package.path == batched_step_path(batched_step_repository, SMALL, 0, 32, "cpu") and package.path.is_file()


def test_cold_partly_and_fully_cached_users_agree_with_the_per_user_engine(engines):
    users = [make_user(10 + i, 30 + 11 * i, 2 + i) for i in range(4)]
    one = make_user(20, 25, 1)  # a single candidate: the smallest sizes the package takes
    both(engines, *[prefix(u, 12) for u in users[:2]], one)
    mixed = both(engines, *users, one)
    assert mixed.cached_tokens.tolist() == [history_tokens(12)] * 2 + [0, 0, history_tokens(25)]
    again = both(engines, *users, one)  # fully cached: only what the package wrote into the pool
    assert not again.computed_tokens.any()
    assert tiers(engines[1].cache.stats()) == tiers(engines[0].cache.stats())
    pool_is_consistent(engines[1])


def test_a_full_request_of_the_longest_histories(engines):
    users = [make_user(200 + i, SMALL.max_history, SMALL.max_candidates if i % 2 else 1, seed=i)
             for i in range(SMALL.max_batch)]
    both(engines, *[prefix(u, 100) for u in users])
    result = both(engines, *users)
    assert (result.cached_tokens == history_tokens(100)).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU package carries the Triton kernel: needs a GPU")
def test_on_a_gpu_the_package_carries_the_kernel_and_matches_eager(tmp_path):
    gpu = build_model(SMALL, seed=0).to("cuda")
    eager = build_batched_engine(gpu, 1 << 13, 32)
    info = export_batched_step(gpu, 32, tmp_path / "step.pt2")
    compiled = build_batched_engine(gpu, 1 << 13, 32, forward_step=load_batched_step(info.path))
    users = [make_user(300 + i, 60 + 9 * i, 3 + i, seed=i) for i in range(4)]
    for _ in range(2):  # cold, then fully cached (through the CUDA graphs of the package's step)
        got, want = serve(compiled, *users), serve(eager, *users)
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-4, rtol=0)
    assert compiled.graphs is not None and len(compiled.graphs.graphs) == 1  # captured, not turned off
    print(f"compiled in {info.compile_seconds:.1f} s")
