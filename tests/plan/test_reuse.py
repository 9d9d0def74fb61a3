import pytest

from hstu_replay.interface import history_tokens
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.reuse import prime_items, warm_items


def test_warm_append_reaches_the_target_ratio():
    held = history_tokens(100)  # 206 tokens held
    m = warm_items(0.5, held, 100, 4096)
    assert m == 203  # T(203) = 412 = 2 x 206
    assert held / history_tokens(m) == pytest.approx(0.5)


def test_warm_full_hit_repeats_the_history():
    assert warm_items(1.0, history_tokens(50), 50, 4096) == 50


def test_a_warm_key_too_short_to_grow_is_not_repeated_below_full_hits():
    # 1 item held (8 tokens): 0.9 would need 8 / 0.9 = 8.9 tokens, which rounds back to 1 item
    assert warm_items(0.9, history_tokens(1), 1, 4096) is None
    assert warm_items(1.0, history_tokens(1), 1, 4096) == 1


def test_warm_out_of_reach_returns_none():
    assert warm_items(0.1, history_tokens(1000), 1000, 4096) is None  # would need 10x the history
    assert warm_items(0.0, 100, 10, 4096) is None
    assert warm_items(0.5, 0, 0, 4096) is None


@pytest.mark.parametrize("target", [0.25, 0.5, 0.75, 0.9, 1.0])
def test_prime_prefix_gives_the_target(target):
    m = 1000
    p = prime_items(target, m)
    assert abs(history_tokens(p) / history_tokens(m) - target) <= 1 / history_tokens(m)


def test_no_prime_when_cold_is_closer():
    assert prime_items(0.0, 500) is None
    assert prime_items(0.001, 500) is None  # 1 token wanted: closer to 0 than to 6
    assert prime_items(1.0, 0) == 0  # contextual tokens only


def test_keys_are_disjoint_across_users_and_workers():
    a, b, c = KeyAllocator(0, 0, nonce=5), KeyAllocator(0, 1, nonce=5), KeyAllocator(1, 0, nonce=5)
    keys = [k.new_key() for k in (a, b, c) for _ in range(100)]
    assert len(set(keys)) == len(keys)
    assert all(0 < k < 2**63 for k in keys)


def test_a_hit_mix_keeps_the_tally_within_one_request_of_the_target():
    from hstu_replay.plan.reuse import HitMix

    mix = HitMix()
    hits = sent = 0
    for tokens in [206, 406, 46, 512, 300] * 20:
        hit = mix.wants_hit(0.3, tokens)
        mix.book(0.3, tokens if hit else 0, tokens)
        hits, sent = hits + (tokens if hit else 0), sent + tokens
        assert abs(hits - 0.3 * sent) <= 512 / 2  # at most half the largest request from the target
    assert mix.wants_hit(0.7, 100)  # each target keeps its own tally: 0.7 starts afresh (a hit brings it nearer)
    assert not HitMix().wants_hit(0.4, 100)  # 0 of 100 is nearer 0.4 than 100 of 100


def test_misses_with_no_key_at_hand_are_not_paid_back_at_length():
    """50 cold requests of 100 tokens (a first pass: no key holds anything yet), then choices at 0.5:
    the shortfall carried is half a request's, so the choices alternate at once instead of 25 hits in a row."""
    from hstu_replay.plan.reuse import HitMix

    mix = HitMix()
    for _ in range(50):
        mix.missed(0.5, 100)
    chosen = []
    for _ in range(6):
        chosen.append(mix.wants_hit(0.5, 100))
        mix.book(0.5, 100 if chosen[-1] else 0, 100)
    assert chosen == [True, False, True, False, True, False]
