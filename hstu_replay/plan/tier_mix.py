"""A target mix of cache tiers (`--tier-mix gpu:0.6,host:0.3,miss:0.1`) and the order that meets it.

The mix is the share of users in measured requests whose reuse comes from the GPU pool, from the
host pool (onboarded), or from nowhere (recomputed). A source asks `TierPattern.next()` which tier
each slot should meet next: the tier furthest behind its share of the slots planned so far, so
any stretch of n slots is within one slot per tier of the mix (the order does not depend on what
the cache held, so a tier that could not be met once is not made up for later, which would
overshoot it in the measured window).
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay.errors import ConfigError
from hstu_replay.plan.tiers import Tier

MIX_SUM_TOLERANCE = 1e-6


@dataclass(frozen=True)
class TierMix:
    gpu: float
    host: float
    miss: float

    def share(self, tier: Tier) -> float:
        return getattr(self, tier.value)

    def as_dict(self) -> dict[str, float]:
        return {t.value: self.share(t) for t in Tier}

    @classmethod
    def parse(cls, text: str, flag: str = "--tier-mix") -> TierMix:
        """'gpu:0.6,host:0.3,miss:0.1' (a tier left out: 0); shares in 0..1 that add up to 1."""
        names = [t.value for t in Tier]
        shares = dict.fromkeys(names, 0.0)
        for part in (p.strip() for p in str(text).split(",") if p.strip()):
            name, sep, value = part.partition(":")
            name = name.strip().lower()
            try:
                share = float(value)
            except ValueError:
                share = -1.0
            if not sep or name not in shares or not 0.0 <= share <= 1.0:
                raise ConfigError(f"{flag} {text!r}: give tier:share pairs, tiers {', '.join(names)}, shares in 0..1 "
                                  f"(e.g. gpu:0.6,host:0.3,miss:0.1)")
            shares[name] = share
        if abs(sum(shares.values()) - 1.0) > MIX_SUM_TOLERANCE:
            raise ConfigError(f"{flag} {text!r}: the shares add up to {sum(shares.values()):g}, not 1")
        return cls(**shares)


class TierPattern:
    """The tier each next slot should meet, in proportion to the mix."""

    def __init__(self, mix: TierMix):
        self.mix = mix
        self.planned = dict.fromkeys(Tier, 0)

    def next(self) -> Tier:
        n = sum(self.planned.values()) + 1
        tier = max(Tier, key=lambda t: (self.mix.share(t) * n - self.planned[t], self.mix.share(t)))
        self.planned[tier] += 1
        return tier
