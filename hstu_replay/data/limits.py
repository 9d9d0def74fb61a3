"""How much memory `data prepare` may use, and how many events that lets it sort at once.

Kept apart from the preparation itself so that building the command line stays free of pyarrow.
"""

from __future__ import annotations

from hstu_replay.errors import ConfigError

#: The default of `data prepare --memory-gb`: the whole process stays under 4 GB.
DEFAULT_MEMORY_GB = 3.0
#: What the process holds besides a sorting group (interpreter, pyarrow, one CSV block, per-user tallies).
BASE_BYTES = 600_000_000
#: Bytes per event while a group is sorted: its records (25), the sort key, a temporary, the order,
#: the kept flag and one output column (about 60 together), with room to spare.
SORT_BYTES_PER_EVENT = 110
#: The fewest events a group may hold (below it the limit is refused as too small).
MIN_GROUP_EVENTS = 1 << 16


def group_events(memory_gb: float) -> int:
    """Events one sorting group may hold under `memory_gb`; ConfigError when too little."""
    budget = int(memory_gb * 1e9) - BASE_BYTES
    events = budget // SORT_BYTES_PER_EVENT
    if not events >= MIN_GROUP_EVENTS:
        least = (BASE_BYTES + SORT_BYTES_PER_EVENT * MIN_GROUP_EVENTS) / 1e9
        raise ConfigError(f"--memory-gb {memory_gb:g}: too little to prepare in (at least {least:.2f})")
    return events
