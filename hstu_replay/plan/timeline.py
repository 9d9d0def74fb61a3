"""Natural replay: every user's real visits in the log's global time order.

A visit is a user's run of events up to a gap of 60 s or more (the session planner's
definition, `visit_starts`). Replaying visit v of a user sends the user's history so far (its
events before v, capped from the start at the longest history a full batch can carry) and asks
to rank v's first events as candidates. A user's first visit has no history: it is not sent,
its events are the history of the next. Requests group the visits that fall in the same time
slice (consecutive in time order, distinct users, at most a batch), so the hit ratio is not
chosen: it is whatever the server's cache holds when a user comes back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hstu_replay.interface import NUM_CONTEXT_TOKENS, Limits
from hstu_replay.plan.sessions import visit_starts


@dataclass(frozen=True, eq=False)
class Trace:
    """Visits in send order (time, then user); one entry per replayed visit."""

    users: np.ndarray  # store index of the visit's user
    times_ms: np.ndarray  # time of the visit's first event
    starts: np.ndarray  # the visit's first event, as an index into the user's own events
    history: np.ndarray  # history items sent (events before the visit, capped)
    candidates: np.ndarray  # candidates asked for (the visit's events, at most --candidates)
    history_cap: int

    def __len__(self) -> int:
        return len(self.users)

    @property
    def tokens(self) -> np.ndarray:
        """KV tokens of each visit's history (total_history_length)."""
        return NUM_CONTEXT_TOKENS + 2 * self.history.astype(np.int64)


def build_trace(store, candidates: int, limits: Limits, batch_size: int) -> Trace:
    """Every visit with some history before it, of every user of `store`, in time order.
    Histories are capped at the longest that lets `batch_size` users fit `limits.max_values`."""
    cap = limits.history_cap(batch_size, candidates)
    users, times, starts, ends = [], [], [], []
    offsets = np.asarray(store.offsets, dtype=np.int64)
    all_times = store.times_ms
    for u in range(len(store)):
        t = np.asarray(all_times[offsets[u]:offsets[u + 1]])
        s = visit_starts(t)  # first visit (starting at 0) has no history: left out
        if len(s) == 0:
            continue
        users.append(np.full(len(s), u, dtype=np.int32))
        times.append(t[s])
        starts.append(s)
        ends.append(np.append(s[1:], len(t)))
    if not users:
        return Trace(*(np.zeros(0, dtype=np.int64) for _ in range(5)), history_cap=cap)
    users, times, starts, ends = (np.concatenate(a) for a in (users, times, starts, ends))
    order = np.lexsort((starts, users, times))  # time, then user, then visit
    users, times, starts, ends = users[order], times[order], starts[order], ends[order]
    return Trace(users=users, times_ms=times.astype(np.int64), starts=starts.astype(np.int64),
                 history=np.minimum(starts, cap).astype(np.int64),
                 candidates=np.minimum(ends - starts, candidates).astype(np.int64), history_cap=cap)


def group_requests(trace: Trace, slice_ms: int, batch_size: int) -> np.ndarray:
    """Request boundaries: request r is trace[bounds[r]:bounds[r + 1]]. A request takes the
    consecutive visits of one time slice of `slice_ms` (0: one visit each), distinct users,
    at most `batch_size` of them."""
    n = len(trace)
    if slice_ms <= 0 or batch_size <= 1:
        return np.arange(n + 1, dtype=np.int64)
    slices = trace.times_ms // slice_ms
    bounds = [0]
    members: set[int] = set()
    for i in range(n):
        user = int(trace.users[i])
        if i > bounds[-1] and (slices[i] != slices[bounds[-1]] or user in members or len(members) >= batch_size):
            bounds.append(i)
            members.clear()
        members.add(user)
    bounds.append(n)
    return np.asarray(bounds, dtype=np.int64)
