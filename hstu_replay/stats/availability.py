"""Whether the server answers, as this process's users see it: when it went away, when it came back.

Downtime counts from the first refused request to the next answered one, in the stage where it
began. Each return starts a new epoch: what the client believed the server's cache held before
it is void (a restarted server holds nothing), so steps planned before are not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hstu_replay.stats.run_stats import BinKey, RunStats


class Availability:
    def __init__(self, stats: RunStats, say: Callable[[str], None], server: int = -1, name: str = "the server"):
        self.stats, self.say = stats, say
        self.server, self.name = server, name  # a fleet's server: its index (its figures') and address
        self.epoch = 0
        self.down_since: float | None = None  # time.monotonic()
        self._stage: BinKey | None = None

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def refused(self, stage: BinKey, now: float | None = None) -> None:
        if self.down_since is None:
            self.down_since, self._stage = time.monotonic() if now is None else now, stage
            self.say(f"{self.name} stopped answering (stage {stage.name()}); its users back off until it returns")

    def _count_down(self, now: float | None) -> float:
        """The outage so far added to the stage it began in (and to its server's figures)."""
        now = time.monotonic() if now is None else now
        down = now - self.down_since
        self.stats.bin(self._stage).server_down_s += down
        if self.server >= 0:
            self.stats.server_bin(self._stage, self.server).server_down_s += down
        self.down_since = now
        return down

    def settle(self, now: float | None = None) -> None:
        """At the end of a run: an outage still going counts up to now (and on, if it goes on)."""
        if self.down_since is not None:
            self._count_down(now)

    def answered(self, now: float | None = None) -> bool:
        """True when this answer ends an outage (a new epoch begins)."""
        if self.down_since is None:
            return False
        down = self._count_down(now)
        self.down_since, self._stage = None, None
        self.epoch += 1
        self.say(f"{self.name} answers again after {down:.1f} s; cache predictions made before are void, "
                 "every cache key is replaced")
        return True
