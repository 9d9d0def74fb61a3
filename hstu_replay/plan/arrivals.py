"""Open-loop arrivals: the intended send times of one request stream.

Requests leave at these times whatever the server's response times, and each request's
latency is also measured from its intended time, so a stalled server cannot hide its stall
behind a client that waited for it (coordinated omission).
"""

from __future__ import annotations

import random

from hstu_replay.errors import ConfigError


class ArrivalClock:
    def __init__(self, kind: str, rate: float, start: float, rng: random.Random):
        if kind not in ("constant", "poisson") or rate <= 0:
            raise ConfigError(f"arrivals {kind!r} at {rate}/s: use constant or poisson at a positive rate")
        self.kind, self.rate, self.rng = kind, rate, rng
        # A random phase, so that many constant-rate streams do not send in lockstep.
        self._next = start + (rng.random() / rate if kind == "constant" else rng.expovariate(rate))

    def next(self) -> float:
        """The intended time of the next request; later calls give later times."""
        intended = self._next
        self._next += 1 / self.rate if self.kind == "constant" else self.rng.expovariate(self.rate)
        return intended
