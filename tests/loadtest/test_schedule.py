"""The sweep clock: time-based stages, and stages that end on a measured-request quota."""

from __future__ import annotations

from hstu_replay.loadtest.schedule import Schedule, SweepClock


def test_stages_follow_the_time_since_the_sweep_started():
    clock = SweepClock(Schedule((1, 8), (0.0, 1.0), warmup_s=1.0, measure_s=4.0))
    assert clock.position() is None and not clock.over()  # users still spawning: no stage
    clock.start()
    t0 = clock.started_at
    first = clock.position(t0 + 0.5)
    assert first.stage.index == 0 and first.warming_up
    assert not clock.position(t0 + 1.5).warming_up
    assert clock.position(t0 + 5.5).stage.key.goal_ratio == 1.0
    assert clock.position(t0 + 19.0).stage.key.batch_size == 8
    assert clock.position(t0 + 20.0) is None


def test_a_quota_ends_a_stage_before_its_seconds():
    clock = SweepClock(Schedule((1,), (0.0, 0.5), warmup_s=1.0, measure_s=100.0), stage_requests=3)
    clock.start()
    t0 = clock.started_at
    assert clock.position(t0 + 0.5).warming_up
    stage = clock.position(t0 + 2.0).stage
    for _ in range(3):
        clock.measured(stage)
    second = clock.position(t0 + 3.0)  # the quota is met: the next stage starts now, warming up
    assert second.stage.index == 1 and second.warming_up
    assert not clock.position(t0 + 4.5).warming_up
    clock.measured(clock.schedule.stages[0])  # a late answer of the old stage counts for nothing
    assert clock.position(t0 + 4.6).stage.index == 1
    assert clock.position(t0 + 104.1) is None  # the seconds stay the upper bound


def test_progress_says_which_stages_ran_fully_partly_or_not_at_all():
    clock = SweepClock(Schedule((1,), (0.0, 0.5, 1.0), warmup_s=1.0, measure_s=2.0))  # stages of 3 s
    names = (lambda stages: [s.key.name() for s in stages])
    before = clock.progress()  # users still spawning: nothing ran
    assert (names(before.full), names(before.partial), names(before.not_run)) == (
        [], [], ["b1_h0.00", "b1_h0.50", "b1_h1.00"])
    clock.start(elapsed_s=4.0)  # 1 s into the second stage (its warm-up)
    during = clock.progress()
    assert (names(during.full), names(during.partial), names(during.not_run)) == (
        ["b1_h0.00"], ["b1_h0.50"], ["b1_h1.00"])
    over = SweepClock(clock.schedule)
    over.start(elapsed_s=9.5)  # the sweep's 9 s are over
    assert (len(over.progress().full), over.progress().partial, over.progress().not_run) == (3, (), ())
