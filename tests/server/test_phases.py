"""The per-phase clock of served models, on a hand-driven clock."""

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.server.phases import ENV, NO_CLOCK, PhaseClock, phases_every


class Ticks:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_every_n_calls_one_line_of_mean_ms_per_phase_then_a_fresh_count():
    ticks, lines = Ticks(), []
    clock = PhaseClock("m", every=2, write=lines.append, clock=ticks)
    for inputs_ms, engine_ms, graph_ms, gap_ms in ((1, 4, 3, 0.5), (3, 6, 5, 1.5), (10, 10, 10, 10)):
        with clock.call():
            with clock.phase("inputs"):
                ticks.now += inputs_ms / 1e3
            with clock.phase("engine"):
                with clock.phase("engine.graph"):
                    ticks.now += graph_ms / 1e3
                ticks.now += (engine_ms - graph_ms) / 1e3
            ticks.now += gap_ms / 1e3
    # two calls: inputs (1+3)/2, engine (4+6)/2 of which the graph (3+5)/2; whole 2+5+... gaps 0.5, 1.5
    assert lines == ["phases m: 2 calls, ms per call: inputs 2.000, engine 5.000, engine.graph 4.000; "
                     "whole 8.000, other 1.000"]
    assert clock.calls == 1 and set(clock.totals) == {"inputs", "engine", "engine.graph"}


def test_off_times_nothing():
    ticks, lines = Ticks(), []
    clock = PhaseClock("m", every=0, write=lines.append, clock=ticks)
    for _ in range(5):
        with clock.call(), clock.phase("inputs"):
            ticks.now += 1
    assert lines == [] and clock.totals == {} and clock.calls == 0
    assert NO_CLOCK.every == 0


def test_a_failing_call_is_still_counted():
    ticks, lines = Ticks(), []
    clock = PhaseClock("m", every=1, write=lines.append, clock=ticks)
    with pytest.raises(RuntimeError), clock.call(), clock.phase("engine"):
        ticks.now += 0.002
        raise RuntimeError("boom")
    assert lines == ["phases m: 1 calls, ms per call: engine 2.000; whole 2.000, other 0.000"]


def test_the_count_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert phases_every() == 0
    monkeypatch.setenv(ENV, "50")
    assert phases_every() == 50
    for bad in ("-1", "ten", "1.5"):
        monkeypatch.setenv(ENV, bad)
        with pytest.raises(ConfigError, match=ENV):
            phases_every()
