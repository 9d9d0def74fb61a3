"""What a process is doing, read through psutil: liveness, descendants, CPU times, memory.

The one place that looks at processes from outside: the child lifecycle (`hstu_replay.process`),
the target's watchdog and the benchmarks read every figure here. A process is known by its pid and
its start time together, so that a pid the kernel gave again to someone else is never taken for
it; a zombie (exited, not yet reaped) counts as gone. Torch-free, and light enough for a worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

#: pid -> start time (psutil's create time, seconds since the epoch) of processes seen earlier
Noted = dict[int, float]


def start_time(pid: int) -> float | None:
    """The start time of `pid` while it runs (a zombie has ended); None once it is gone."""
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None


def is_alive(pid: int, started: float | None = None) -> bool:
    """`pid` runs (and, given `started`, is still the process that started then)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def descendants(owner: int) -> Noted:
    """Every live descendant of `owner` (children, their children, ...) with its start time."""
    try:
        children = psutil.Process(owner).children(recursive=True)
    except psutil.Error:
        return {}
    return {child.pid: started for child in children if (started := start_time(child.pid)) is not None}


def family(owner: int) -> Noted:
    """`owner` and its live descendants; empty once `owner` is gone."""
    started = start_time(owner)
    return {} if started is None else {**descendants(owner), owner: started}


def kill_noted(noted: Noted) -> list[int]:
    """SIGKILL each noted process that still runs as the one noted; the pids killed."""
    killed = []
    for pid, started in noted.items():
        if is_alive(pid, started):
            try:
                psutil.Process(pid).kill()
                killed.append(pid)
            except psutil.Error:
                pass
    return killed


def still_running(noted: Noted) -> list[int]:
    """The noted processes that still run as the ones noted."""
    return [pid for pid, started in noted.items() if is_alive(pid, started)]


@dataclass(frozen=True)
class ProcTimes:
    """CPU a whole process (all its threads) has used, and its minor page faults."""

    user_s: float
    system_s: float
    minor_faults: int

    @classmethod
    def of(cls, pid: int) -> ProcTimes:
        times = psutil.Process(pid).cpu_times()
        return cls(times.user, times.system, minor_faults(pid))


def minor_faults(pid: int) -> int:
    """Minor page faults of `pid`, all threads. psutil reads no fault counts on Linux, so this one
    figure comes from the kernel's stat line itself (field 10, after the parenthesised name)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[7])


def rss_mib(pid: int | None = None) -> float:
    """Resident set size of `pid` (default: this process), MiB."""
    return psutil.Process(pid).memory_info().rss / 2**20


def mapped_paths(pid: int | None = None) -> set[str]:
    """The files `pid` (default: this process) has mapped: its executable, the libraries loaded."""
    return {region.path for region in psutil.Process(pid).memory_maps() if region.path}


@dataclass(frozen=True)
class HostTimes:
    """The host's busy and total CPU time over every core since boot, seconds; idle and I/O wait
    are not busy (guest time is inside user time, as the kernel counts it)."""

    busy_s: float
    total_s: float

    @classmethod
    def now(cls) -> HostTimes:
        t = psutil.cpu_times()
        total = t.user + t.nice + t.system + t.idle + t.iowait + t.irq + t.softirq + t.steal
        return cls(total - t.idle - t.iowait, total)


def load_average() -> tuple[float, float, float]:
    """The host's run-queue averages over 1, 5 and 15 minutes."""
    return psutil.getloadavg()
