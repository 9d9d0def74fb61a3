"""Processes as the kernel lists them, read here from /proc directly: the tests' own view, apart
from the psutil inspection the code under test looks through."""

from __future__ import annotations

from pathlib import Path


def state(pid: int) -> str | None:
    """The one-letter state of `pid` (R, S, Z, ...); None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def running(pid: int) -> bool:
    """`pid` exists and is no zombie."""
    return state(pid) not in (None, "Z")
