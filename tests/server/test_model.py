import numpy as np
import pytest
import torch

from hstu_replay.errors import ConfigError
from hstu_replay.server.model_config import CONFIGS, DTYPES, ModelConfig, get_config
from hstu_replay.server import model as model_module
from hstu_replay.server.model import EagerCompute, JaggedRanker, build_model, weights_digest
from hstu_replay.verify import DEFAULT_TOLERANCE

SMALL = get_config("small")


@pytest.fixture(scope="module")
def model():
    return build_model(SMALL, seed=0)


@pytest.fixture(scope="module")
def compute(model):
    return EagerCompute(model)


def empty(config=SMALL, dtype=torch.float32):
    return torch.zeros(config.num_layers, 0, config.num_heads, config.head_dim, dtype=dtype)


def tokens(seed, hist_items, cands):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(-(1 << 40), 1 << 40, (6 + 2 * hist_items,), generator=gen)
    return ids, torch.randint(0, 1 << 40, (cands,), generator=gen)


def test_registry_and_lookup():
    assert {"kuairand-1k", "kuairand-1k-8l", "small"} <= set(CONFIGS)
    big, deep = CONFIGS["kuairand-1k"], CONFIGS["kuairand-1k-8l"]
    assert (big.num_layers, big.hidden_dim, big.num_heads, big.head_dim) == (3, 512, 4, 128)
    assert (big.max_history, big.max_candidates, big.action_table_size) == (4096, 100, 256)
    assert deep.num_layers == 8 and deep.hidden_dim == big.hidden_dim
    with pytest.raises(ConfigError, match="known: kuairand-1k, kuairand-1k-8l, small"):
        get_config("huge")
    with pytest.raises(ConfigError, match="dtype"):
        ModelConfig(**{**SMALL.__dict__, "dtype": "float16"})


def test_shapes_and_seeded_weights(model, compute):
    hist, cands = tokens(1, 20, 5)
    logits, k, v = compute(hist, cands, empty(), empty())
    assert logits.shape == (5, 8) and logits.dtype == torch.float32
    assert k.shape == v.shape == (SMALL.num_layers, 46, SMALL.num_heads, SMALL.head_dim)
    same = EagerCompute(build_model(SMALL, seed=0))(hist, cands, empty(), empty())[0]
    other = EagerCompute(build_model(SMALL, seed=1))(hist, cands, empty(), empty())[0]
    assert torch.equal(logits, same) and not torch.allclose(logits, other)
    loaded = build_model(SMALL, seed=5, state_dict=model.state_dict())
    assert torch.equal(EagerCompute(loaded)(hist, cands, empty(), empty())[0], logits)


def test_candidates_do_not_see_each_other(compute):
    hist, cands = tokens(2, 30, 6)
    together = compute(hist, cands, empty(), empty())[0]
    for j in range(6):
        alone = compute(hist, cands[j : j + 1], empty(), empty())[0]
        assert torch.allclose(alone[0], together[j], atol=1e-5)
    # ... but they do see the history, and each other's ids do not collide in one slot
    changed = hist.clone()
    changed[10] += 1
    assert not torch.allclose(compute(changed, cands, empty(), empty())[0], together)
    assert not torch.allclose(together[0], together[1])


@pytest.mark.parametrize("split", [0, 1, 5, 6, 7, 33, 66])
def test_any_split_gives_the_cold_result(compute, split):
    hist, cands = tokens(3, 30, 4)
    cold, k_cold, v_cold = compute(hist, cands, empty(), empty())
    _, k1, v1 = compute(hist[:split], cands[:1], empty(), empty())
    warm, k2, v2 = compute(hist[split:], cands, k1, v1)
    assert torch.allclose(warm, cold, atol=1e-5)
    assert torch.allclose(torch.cat([k1, k2], 1), k_cold, atol=1e-5)
    assert torch.allclose(torch.cat([v1, v2], 1), v_cold, atol=1e-5)


def test_a_history_token_is_not_changed_by_later_ones(compute):
    hist, cands = tokens(4, 20, 2)
    _, k_short, _ = compute(hist[:20], cands, empty(), empty())
    _, k_long, _ = compute(hist, cands, empty(), empty())
    assert torch.allclose(k_long[:, :20], k_short, atol=1e-5)


def test_bfloat16_model_runs():
    config = ModelConfig(**{**SMALL.__dict__, "dtype": "bfloat16"})
    compute = EagerCompute(build_model(config, seed=0))
    hist, cands = tokens(5, 10, 3)
    logits, k, _ = compute(hist, cands, empty(config, torch.bfloat16), empty(config, torch.bfloat16))
    assert logits.dtype == torch.float32 and k.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name, items", [("small", 120), ("kuairand-1k", 300)])
def test_a_cache_of_another_history_fails_nvidias_check_where_bf16_rounding_passes_it(name, items):
    """What makes answers from a wrong cache visible: for the same candidates, a history of the same
    length that is another user's, or whose first half (what a cache would hold) is, moves the logits
    beyond NVIDIA's tolerance; the same model in bf16 stays far inside it."""
    config = get_config(name)
    exact, rounded = (EagerCompute(build_model(get_config(name, dtype), seed=0)) for dtype in DTYPES)
    for seed in range(3):
        mine, cands = tokens(seed, items, 16)
        other = tokens(100 + seed, items, 16)[0]
        other[:6] = mine[:6]  # the same user and context
        stale = torch.cat([other[:len(mine) // 2], mine[len(mine) // 2:]])

        def answer(compute, hist, dtype=torch.float32):
            return compute(hist, cands, empty(config, dtype), empty(config, dtype))[0]

        right = answer(exact, mine)
        assert (answer(exact, other) - right).abs().max() > 2 * DEFAULT_TOLERANCE
        assert (answer(exact, stale) - right).abs().max() > DEFAULT_TOLERANCE
        assert (answer(rounded, mine, torch.bfloat16) - right).abs().max() < DEFAULT_TOLERANCE / 4


def test_the_weights_digest_is_the_seeds_draw(monkeypatch):
    digest = weights_digest(SMALL, 0)
    assert digest == weights_digest(get_config("small", "bfloat16"), 0) != weights_digest(SMALL, 1)
    monkeypatch.setattr(model_module, "OUT_GAIN", model_module.OUT_GAIN / 2)  # another version of the model
    weights_digest.cache_clear()  # a process holds one version: its digests are kept
    try:
        assert weights_digest(SMALL, 0) != digest
    finally:
        monkeypatch.undo()
        weights_digest.cache_clear()


def test_jagged_ranker_matches_per_user_compute(model, compute):
    users = [tokens(10 + b, h, c) for b, (h, c) in enumerate([(3, 2), (0, 1), (12, 5)])]
    head = torch.stack([hist[:6] for hist, _ in users]).T.reshape(-1)
    items = [torch.cat([hist[6::2], cands]) for hist, cands in users]
    actions = [torch.cat([hist[7::2], torch.zeros_like(cands)]) for hist, cands in users]
    seq = [len(i) for i in items]
    lengths = torch.tensor([1] * 18 + seq + seq)
    values = torch.cat([head, *items, *actions])
    with torch.no_grad():
        out = JaggedRanker(model)(values, lengths, torch.tensor([len(c) for _, c in users]))
    expected = torch.cat([compute(hist, cands, empty(), empty())[0] for hist, cands in users])
    assert out.shape == (8, 8)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=1e-5)
