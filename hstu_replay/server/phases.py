"""Where a served model's calls spend their time, phase by phase (`HSTU_REPLAY_BACKEND_PHASES=N`).

A `PhaseClock` sums the wall time of named phases (`with clock.phase("engine"): ...`) and, every N
calls, writes one line: the mean milliseconds per call of each phase, in the order they first ran,
then the calls' whole time and what the named phases leave unexplained. A phase named `outer.inner`
runs inside `outer`: it is shown, not subtracted again. Off (N = 0, the default)
a phase costs one attribute read and a shared no-op context.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import ContextManager

from hstu_replay.errors import ConfigError

ENV = "HSTU_REPLAY_BACKEND_PHASES"
_OFF = nullcontext()


def phases_every() -> int:
    """N from the environment: print every N calls (0: off)."""
    text = os.environ.get(ENV, "").strip() or "0"
    if not text.isdigit():
        raise ConfigError(f"{ENV}={text!r}: expected a count of calls (0 turns it off)")
    return int(text)


class PhaseClock:
    def __init__(self, label: str, every: int = 0, write: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.label = label
        self.every = every
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self.totals: dict[str, float] = {}
        self.calls = 0
        self.whole = 0.0

    def phase(self, name: str) -> ContextManager:
        return self._timed(name) if self.every else _OFF

    @contextmanager
    def call(self) -> Iterator[None]:
        """One call: its whole time, and the line every `every` calls."""
        if not self.every:
            yield
            return
        started = self.clock()
        try:
            yield
        finally:
            self.whole += self.clock() - started
            self.calls += 1
            if self.calls >= self.every:
                self.write(self.line())
                self.totals, self.calls, self.whole = {}, 0, 0.0

    def line(self) -> str:
        per_call = 1e3 / max(self.calls, 1)
        parts = [f"{name} {seconds * per_call:.3f}" for name, seconds in self.totals.items()]
        rest = self.whole - sum(seconds for name, seconds in self.totals.items() if "." not in name)
        return (f"phases {self.label}: {self.calls} calls, ms per call: {', '.join(parts)}; "
                f"whole {self.whole * per_call:.3f}, other {rest * per_call:.3f}")

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        self.totals.setdefault(name, 0.0)  # shown in the order the phases start
        started = self.clock()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + self.clock() - started


NO_CLOCK = PhaseClock("off")  # times nothing
