import numpy as np
import pytest
import torch

from hstu_replay.errors import ConfigError
from hstu_replay.server.model_config import CONFIGS, ModelConfig, get_config
from hstu_replay.server.model import EagerCompute, JaggedRanker, build_model

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
