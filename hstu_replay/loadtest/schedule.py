"""The sweep: one stage per (batch size, hit ratio), each a warm-up then a measured window.

Every process derives the current stage from the time since its own test start, so Locust
workers follow the master's sweep without extra messages.
"""

from __future__ import annotations

import math
import time
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


@dataclass(frozen=True)
class SweepProgress:
    """How far the sweep got by a moment: the stages it ran fully, the one it was in, those it never started."""

    full: tuple[Stage, ...]
    partial: tuple[Stage, ...]
    not_run: tuple[Stage, ...]


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


class SweepClock:
    """The sweep's time in this process. It starts when spawning completes, so users still
    ramping up never fall inside a measured window; until then there is no stage.

    With a `stage_requests` quota a stage also ends once that many measured requests were
    filed in it (its seconds stay the upper bound): stages then start when the last one ended.
    """

    def __init__(self, schedule: Schedule, stage_requests: int = 0):
        self.schedule = schedule
        self.quota = stage_requests
        self.started_at = math.nan  # time.monotonic() when the sweep began
        self.started_epoch = math.nan
        self._index = 0  # with a quota: the current stage, since when, and its measured count
        self._stage_started = math.nan
        self._measured = 0

    @property
    def started(self) -> bool:
        return not math.isnan(self.started_at)

    def start(self, elapsed_s: float = 0.0) -> None:
        """Start the sweep `elapsed_s` seconds ago (a worker joining its master's sweep)."""
        if not self.started:
            self.started_at, self.started_epoch = time.monotonic() - elapsed_s, time.time() - elapsed_s
            self._stage_started = self.started_at

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at if self.started else 0.0

    def position(self, at: float | None = None) -> StagePosition | None:
        """The stage at monotonic time `at` (default now); None before the start and after the end."""
        if not self.started:
            return None
        now = time.monotonic() if at is None else at
        if not self.quota:
            return self.schedule.at(now - self.started_at)
        stages = self.schedule.stages
        while self._index < len(stages):  # bounded: one pass over the stages
            stage = stages[self._index]
            if self._measured < self.quota and now - self._stage_started < stage.warmup_s + stage.measure_s:
                return StagePosition(stage, now - self._stage_started < stage.warmup_s)
            self._index, self._stage_started, self._measured = self._index + 1, max(now, self._stage_started), 0
        return None

    def measured(self, stage: Stage) -> None:
        """One more measured request filed in `stage` (counts towards the quota)."""
        if self.quota and stage.index == self._index:
            self._measured += 1

    def over(self) -> bool:
        return self.started and self.position() is None

    def progress(self) -> SweepProgress:
        """How far the sweep has got now: before its start no stage ran; after its end every one did."""
        stages = tuple(self.schedule.stages)
        position = self.position()
        if position is None:
            return SweepProgress(stages, (), ()) if self.started else SweepProgress((), (), stages)
        i = position.stage.index
        return SweepProgress(stages[:i], (stages[i],), stages[i + 1:])
