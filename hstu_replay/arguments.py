"""Numbers from command-line text, checked once: one line naming the option, the value and the rule."""

from __future__ import annotations

import math

from hstu_replay.errors import ConfigError


def number(flag: str, text: str | None, low: float | None = None, high: float | None = None, *,
           above: bool = False, integral: bool = False) -> float:
    """`text` as a finite number >= `low` (> with `above`) and <= `high`; an int if `integral`."""
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {text!r}: expected a number") from None
    if not math.isfinite(value) or (integral and value != int(value)):
        raise ConfigError(f"{flag} {text!r}: expected a finite {'whole ' if integral else ''}number")
    if low is not None and (value <= low if above else value < low):
        raise ConfigError(f"{flag} {text!r}: must be {'>' if above else '>='} {low:g}")
    if high is not None and value > high:
        raise ConfigError(f"{flag} {text!r}: must be <= {high:g}")
    return int(value) if integral else value


def numbers(flag: str, text: str, low: float | None = None, high: float | None = None, *,
            above: bool = False, integral: bool = False) -> tuple[float, ...]:
    """Comma-separated `number`s, each checked alike."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts) or not all(parts):
        raise ConfigError(f"{flag} {text!r}: give comma-separated numbers")
    return tuple(number(flag, p, low, high, above=above, integral=integral) for p in parts)
