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
import subprocess
import sys
import time

from hstu_replay.inspection import Noted, descendants, is_alive, kill_noted, start_time

PERIOD_S = 0.5


def watch(owner: int) -> list[int]:
    """Note the owner's descendants while it lives (bounded by its life), then kill them."""
    noted: Noted = {}
    watchdog, started = os.getpid(), start_time(owner)
    while started is not None and is_alive(owner, started):
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
