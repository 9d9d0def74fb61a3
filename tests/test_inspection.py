"""Processes seen through psutil, checked against what real child processes report of themselves
(their own pids, getrusage) or against the kernel's files read here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from hstu_replay import inspection
from tests.kernel import state

# A parent that starts a grandchild and prints both pids, then waits.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print({pid}, child.pid, flush=True)
time.sleep(60)
""".replace("{pid}", "__import__('os').getpid()")

# Burns CPU and touches 64 MiB, then prints its own user CPU and minor faults and waits.
BUSY = """
import resource, time
while resource.getrusage(resource.RUSAGE_SELF).ru_utime < 0.3:
    pass
block = bytearray(64 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime, usage.ru_minflt, flush=True)
time.sleep(60)
"""


def _child(code: str) -> tuple[subprocess.Popen, list[str]]:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    return child, child.stdout.readline().split()


def test_descendants_are_the_pids_the_children_report_and_kill_noted_takes_them():
    parent, (own, grandchild) = _child(PARENT)
    try:
        assert own == str(parent.pid)
        noted = inspection.family(parent.pid)
        assert set(noted) == {parent.pid, int(grandchild)}
        assert inspection.descendants(parent.pid).keys() == {int(grandchild)}
        assert sorted(inspection.still_running(noted)) == sorted(noted)
        assert sorted(inspection.kill_noted(noted)) == sorted(noted)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while inspection.is_alive(int(grandchild)) and time.monotonic() < deadline:
            time.sleep(0.05)  # reparented, then reaped by whoever adopted it
        assert inspection.still_running(noted) == []
    finally:
        parent.kill()
        parent.wait(10)


#: a parent that starts a sleeper, says its pid and never reaps it: the sleeper, killed, stays a
#: zombie whatever this process does with SIGCHLD (gevent's patching, once locust is imported in
#: the same test process, reaps this process's own children at once)
UNREAPING_PARENT = ("import subprocess, sys, time; "
                    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                    "print(c.pid, flush=True); time.sleep(60)")


def test_a_zombie_is_gone_and_a_wrong_start_time_is_someone_else():
    parent = subprocess.Popen([sys.executable, "-c", UNREAPING_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        started = inspection.start_time(pid)
        assert started is not None and inspection.is_alive(pid, started)
        assert not inspection.is_alive(pid, started - 1.0)  # a pid reused by a later process
        assert inspection.kill_noted({pid: started - 1.0}) == []  # so it is not killed
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state(pid) == "Z"  # not reaped yet: the kernel still lists it
        assert not inspection.is_alive(pid) and inspection.start_time(pid) is None
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 10
    while state(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)  # reparented, then reaped by whoever adopted it
    assert inspection.descendants(pid) == {} and inspection.family(pid) == {}


def test_cpu_faults_and_memory_of_a_busy_child_at_least_what_it_counted_itself():
    child, (user_s, minor_faults) = _child(BUSY)
    try:
        times = inspection.ProcTimes.of(child.pid)
        assert times.user_s >= float(user_s) - 0.02 >= 0.25  # the kernel's clock ticks: 10 ms steps
        assert times.minor_faults >= int(minor_faults) >= (64 << 20) // 4096
        assert inspection.rss_mib(child.pid) >= 64
    finally:
        child.kill()
        child.wait(10)


def test_this_process_maps_psutils_own_extension():
    from psutil import _psutil_linux

    assert _psutil_linux.__file__ in inspection.mapped_paths()
    assert inspection.rss_mib() > 0


def test_host_times_grow_and_busy_stays_within_total():
    a = inspection.HostTimes.now()
    end = time.process_time() + 0.1
    while time.process_time() < end:
        pass
    b = inspection.HostTimes.now()
    assert 0 <= a.busy_s <= a.total_s <= b.total_s and a.busy_s <= b.busy_s
    assert a.total_s < b.total_s and a.busy_s < b.busy_s  # this process was busy in between
    assert b.busy_s - a.busy_s <= b.total_s - a.total_s
    assert len(inspection.load_average()) == 3 and min(inspection.load_average()) >= 0
    assert psutil.cpu_count() >= 1
