"""The unit a workload source hands to the load generator."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hstu_replay.request import RequestTensors


@dataclass(frozen=True)
class PlannedStep:
    """An optional priming request (sent first, not measured), then the measured request."""

    request: RequestTensors
    expected_hits: tuple[int, ...]  # tokens each user should find cached, if nothing was evicted
    prime: RequestTensors | None = None
    reference: np.ndarray | None = None  # expected logits [sum(num_candidates), 8]
    label: str = ""  # names the request in failures: dump batch or user/visit
    goal_ratio: float = 0.0
    handles: tuple = ()  # the source's own bookkeeping for `settle` (slots, dump entries)
    send_at_s: float | None = None  # natural replay: when it goes, in seconds after the sweep's start
