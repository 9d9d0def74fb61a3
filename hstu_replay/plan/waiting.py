"""How a natural replay's takers wait their turn (`timeline.Timeline.take`), given from outside:
the planner makes events and starts background work through it, so that it names no concurrency
library. The load test gives its greenlets' (`loadtest.waiting.GREENLETS`); the default is plain
threads, for a replay planned outside Locust.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Waiting:
    event: Callable[[], Any]  # a new event: `wait()` blocks until some `set()`
    spawn: Callable[..., object]  # spawn(fn, *args): fn(*args) in the background


def _thread(fn: Callable[..., object], *args: object) -> None:
    threading.Thread(target=fn, args=args, daemon=True).start()


THREADS = Waiting(threading.Event, _thread)
