"""The sweep: one stage per (batch size, hit ratio), each a warm-up then a measured window.

Every process derives the current stage from the time since its own test start, so Locust
workers follow the master's sweep without extra messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay.stats.run_stats import BinKey


@dataclass(frozen=True)
class Stage:
    index: int
    key: BinKey
    start_s: float  # from test start
    warmup_s: float
    measure_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.warmup_s + self.measure_s


@dataclass(frozen=True)
class StagePosition:
    stage: Stage
    warming_up: bool


class Schedule:
    def __init__(self, batches: tuple[int, ...], ratios: tuple[float, ...], warmup_s: float, measure_s: float):
        self.stages: list[Stage] = []
        t = 0.0
        for batch in batches:
            for ratio in ratios:
                self.stages.append(Stage(len(self.stages), BinKey(batch, ratio), t, warmup_s, measure_s))
                t += warmup_s + measure_s

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s if self.stages else 0.0

    def at(self, elapsed_s: float) -> StagePosition | None:
        """The stage running `elapsed_s` after test start; None once the sweep is over."""
        for stage in self.stages:
            if elapsed_s < stage.end_s:
                return StagePosition(stage, elapsed_s < stage.start_s + stage.warmup_s)
        return None
