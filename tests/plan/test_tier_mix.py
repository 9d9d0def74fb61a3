"""--tier-mix: what it accepts, and the order of tiers that meets it."""

from __future__ import annotations

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.plan.tier_mix import TierMix, TierPattern
from hstu_replay.plan.tiers import Tier


def test_parse_names_each_tier_and_leaves_out_zero():
    assert TierMix.parse("gpu:0.6,host:0.3,miss:0.1") == TierMix(0.6, 0.3, 0.1)
    assert TierMix.parse(" HOST:0.5 , gpu:0.5") == TierMix(0.5, 0.5, 0.0)


@pytest.mark.parametrize("text, says", [
    ("gpu:0.6,host:0.3", "add up to 0.9, not 1"),
    ("gpu:0.6,disk:0.4", "give tier:share pairs"),
    ("gpu:x,miss:1", "give tier:share pairs"),
    ("gpu:1.5,miss:-0.5", "give tier:share pairs"),
    ("gpu", "give tier:share pairs"),
])
def test_a_bad_mix_is_one_line_naming_the_option(text, says):
    with pytest.raises(ConfigError) as err:
        TierMix.parse(text)
    assert str(err.value).startswith(f"--tier-mix {text!r}: ") and says in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("mix", [TierMix(0.6, 0.3, 0.1), TierMix(0.0, 1.0, 0.0), TierMix(0.25, 0.25, 0.5),
                                 TierMix(0.7, 0.0, 0.3)])
def test_every_stretch_of_the_order_is_within_one_slot_of_the_mix(mix):
    pattern = TierPattern(mix)
    order = [pattern.next() for _ in range(1000)]
    for n in range(1, len(order) + 1):
        for tier in Tier:
            assert abs(order[:n].count(tier) - mix.share(tier) * n) < 1.0 + 1e-9, (n, tier)
