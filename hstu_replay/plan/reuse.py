"""How much history a request must find cached to reach a target hit ratio.

A request of m history items carries T(m) = 6 + 2m history tokens; its hit ratio is the
fraction of those the server already holds. Two levers reach a target h: append just enough
to a warm key (m = (held/h - 6) / 2), or prime a fresh key with a shorter prefix of p items
(T(p) = h * T(m)) before the measured request. Where a request cannot be trimmed or grown (a dumped user's
values are sent as dumped), `PartialHits.REUSE` reaches h over many requests instead: each is
either a full hit on a key an earlier request of the same user filled, or a cold request on a
fresh key, chosen by `HitMix` so the tokens found cached stay at h of those sent.
"""

from __future__ import annotations

from enum import StrEnum

from hstu_replay.interface import NUM_CONTEXT_TOKENS, history_tokens


class PartialHits(StrEnum):
    """--partial-hits: how a workload of untrimmable requests (dumps) reaches a ratio between 0 and 1."""

    PRIME = "prime"  # every request at the ratio: a fresh key primed with the prefix that reaches it
    REUSE = "reuse"  # no primes: full hits on reused keys and cold requests, mixed to the ratio in tokens


class HitMix:
    """Which requests of a stream are full hits, so that hit tokens / tokens sent stays at the target.

    One tally per target: a request of `tokens` is a hit when that brings the tally nearer the
    target than a miss would (hits + tokens / 2 < target x (sent + tokens)), so the tally strays
    from the target by at most half a request's tokens while a reusable key is at hand. A miss
    with none at hand (`missed`: a user whose key holds nothing yet, as in a stream's first pass
    over its users) leaves a shortfall of at most half its tokens: were the whole first pass owed,
    the hits paying it back would hold the ratio above the target for about as long again.
    """

    def __init__(self) -> None:
        self._tallies: dict[float, tuple[float, int]] = {}  # target -> (hit tokens, tokens sent)

    def wants_hit(self, target: float, tokens: int) -> bool:
        hits, sent = self._tallies.get(target, (0.0, 0))
        return hits + tokens / 2 < target * (sent + tokens)

    def book(self, target: float, hit_tokens: int, tokens: int) -> None:
        """A request sent as `wants_hit` chose: `hit_tokens` of its `tokens` found cached."""
        hits, sent = self._tallies.get(target, (0.0, 0))
        self._tallies[target] = (hits + hit_tokens, sent + tokens)

    def missed(self, target: float, tokens: int) -> None:
        """A request sent cold for want of a filled key: its shortfall is carried up to half its tokens."""
        hits, sent = self._tallies.get(target, (0.0, 0))
        sent += tokens
        self._tallies[target] = (max(hits, target * sent - tokens / 2), sent)


def warm_items(target: float, held_tokens: int, sent_items: int, max_items: int) -> int | None:
    """History length that makes a warm key's next request hit `target`; None if out of reach."""
    if target <= 0 or held_tokens <= 0:
        return None
    items = round((held_tokens / target - NUM_CONTEXT_TOKENS) / 2)
    if target < 1 and items <= sent_items:  # too short to grow by a whole item: it would be a full hit
        return None
    return items if sent_items <= items <= max_items else None


def prime_items(target: float, items: int) -> int | None:
    """Prefix length to prime a fresh key with so a request of `items` hits `target`.

    None means no prime (a cold request is closer to the target than the smallest prime,
    which already holds the 6 contextual tokens).
    """
    wanted = target * history_tokens(items)
    if wanted < NUM_CONTEXT_TOKENS / 2:
        return None
    return min(max(round((wanted - NUM_CONTEXT_TOKENS) / 2), 0), items)


def hit_ratio(hits: int, tokens: int) -> float:
    return hits / tokens if tokens else 0.0
