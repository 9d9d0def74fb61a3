"""Nothing outlives `server serve`: a watchdog process kills what it started once it is gone.

tritonserver and its Python-backend stubs are children and grandchildren of `server serve`; a
serve killed by SIGKILL (or a tritonserver killed under its stubs) used to leave them running,
holding the ports. The watchdog, in a session of its own, notes the owner's descendants every
PERIOD_S while the owner lives (a stub reparented after its tritonserver died stays noted), and
when the owner is gone SIGKILLs every noted process still alive (same pid and start time).

    python -m hstu_replay.server.watchdog OWNER_PID
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PERIOD_S = 0.5


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live, non-zombie process; None otherwise."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(owner: int) -> dict[int, int]:
    """Every live descendant of `owner`: pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append(int(entry.name))
            starts[int(entry.name)] = stat[1]
    found, todo = {}, [owner]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def kill_noted(noted: dict[int, int]) -> list[int]:
    """SIGKILL each noted process that still runs as the one noted; the pids killed."""
    killed = []
    for pid, start in noted.items():
        stat = proc_stat(pid)
        if stat is not None and stat[1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def watch(owner: int) -> list[int]:
    """Note the owner's descendants while it lives (bounded by its life), then kill them."""
    noted: dict[int, int] = {}
    watchdog = os.getpid()
    while proc_stat(owner) is not None:
        noted.update((pid, start) for pid, start in descendants(owner).items() if pid != watchdog)
        time.sleep(PERIOD_S)
    return kill_noted(noted)


def start_watchdog(owner: int | None = None) -> subprocess.Popen:
    """The watchdog of `owner` (default: this process), in its own session: a signal to the
    owner's process group does not reach it, so it outlives the owner by design, briefly."""
    return subprocess.Popen([sys.executable, "-m", "hstu_replay.server.watchdog", str(owner or os.getpid())],
                            stdin=subprocess.DEVNULL, start_new_session=True)


if __name__ == "__main__":
    killed = watch(int(sys.argv[1]))
    if killed:
        print(f"hstu-replay watchdog: killed {len(killed)} process(es) left by {sys.argv[1]}: {killed}",
              file=sys.stderr, flush=True)
