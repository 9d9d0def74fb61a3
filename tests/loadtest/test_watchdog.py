"""A worker's watch on its master: what counts as the master's silence, and the option."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest import faults
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.options import OPTIONS


class Clocks:
    def __init__(self):
        self.wall, self.cpu = 100.0, 5.0


@pytest.fixture
def clocks(monkeypatch) -> Clocks:
    c = Clocks()
    monkeypatch.setattr(faults.time, "time", lambda: c.wall)
    monkeypatch.setattr(faults.time, "process_time", lambda: c.cpu)
    return c


def test_a_loop_held_by_its_own_work_is_a_stall(clocks):
    stall = faults.Stall()
    clocks.wall, clocks.cpu = 104.0, 8.5  # 4 s late, 3.5 s of it on this process's CPU
    stall.check()
    assert stall.busy_until == 104.0


def test_a_stopped_process_is_no_stall_and_on_time_checks_are_none(clocks):
    stall = faults.Stall()
    clocks.wall, clocks.cpu = 100.25, 5.2
    stall.check()
    clocks.wall, clocks.cpu = 108.0, 5.21  # SIGSTOP: 8 s without CPU, as after a cut network
    stall.check()
    assert stall.busy_until == 0.0


@pytest.mark.parametrize("value, seconds", [(2.5, 2.5), ("3", 3.0), (0, 5.0), ("x", 5.0), (None, 5.0)])
def test_master_timeout_as_the_worker_reads_it(value, seconds):
    options = SimpleNamespace() if value is None else SimpleNamespace(master_timeout=value)
    assert faults.master_timeout(options) == seconds


def test_the_master_timeout_option_is_checked():
    values = {o.dest: o.default for o in OPTIONS}
    values.update(store="/data/store", master_timeout=0.0)
    with pytest.raises(ConfigError, match="--master-timeout 0.0"):
        LoadTestConfig.from_values(values)
    assert {o.dest: o.default for o in OPTIONS}["master_timeout"] <= 5
