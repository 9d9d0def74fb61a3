"""How much history a request must find cached to reach a target hit ratio.

A request of m history items carries T(m) = 6 + 2m history tokens; its hit ratio is the
fraction of those the server already holds. Two levers reach a target h: append just enough
to a warm key (m = (held/h - 6) / 2), or prime a fresh key with a shorter prefix of p items
(T(p) = h * T(m)) before the measured request.
"""

from __future__ import annotations

from hstu_replay.interface import NUM_CONTEXT_TOKENS, history_tokens


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
