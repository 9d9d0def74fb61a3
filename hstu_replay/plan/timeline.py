"""Natural replay: every user's real visits in the log's global time order.

A visit is a user's run of events up to a gap of 60 s or more (the session planner's
definition, `visit_starts`). Replaying visit v of a user sends the user's history so far (its
events before v) and asks to rank v's first events as candidates. A history longer than the
longest a full batch can carry is handled by the `--over-limit` policy (plan.over_limit: skipped,
the oldest items, or the latest on a fresh key). A user's first visit has no history: it is not
sent, its events are the history of the next. Requests group the visits that fall in the same time
slice (consecutive in time order, distinct users, at most a batch), so the hit ratio is not
chosen: it is whatever the server's cache holds when a user comes back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from hstu_replay.errors import HstuReplayError, PlanError
from hstu_replay.interface import Limits, history_tokens
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.over_limit import KINDS, HistoryPolicy, VisitAccounts
from hstu_replay.plan.retired import RetiredKeys
from hstu_replay.plan.sessions import visit_starts
from hstu_replay.plan.step import PlannedStep
from hstu_replay.plan.waiting import THREADS, Waiting
from hstu_replay.request import UserRequest, build_request


@dataclass(frozen=True, eq=False)
class Trace:
    """Visits in send order (time, then user); one entry per replayed visit. Visits the policy
    skips are not replayed: only their users and times are kept, for the accounting."""

    users: np.ndarray  # store index of the visit's user
    times_ms: np.ndarray  # time of the visit's first event
    starts: np.ndarray  # the visit's first event, as an index into the user's own events
    first: np.ndarray  # the first history item sent, as an index into the user's own events
    history: np.ndarray  # history items sent: user's events [first, first + history)
    candidates: np.ndarray  # candidates asked for (the visit's events, at most --candidates)
    kind: np.ndarray  # over_limit.KINDS code: warm, cold, rebased or frozen
    epoch: np.ndarray  # the user's key epoch: a new one is a fresh cache key (a rebase)
    history_cap: int
    policy: HistoryPolicy = HistoryPolicy()
    skipped_users: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # visits not replayed
    skipped_times_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.users)

    @property
    def tokens(self) -> np.ndarray:
        """KV tokens of each visit's history (total_history_length)."""
        return history_tokens(self.history.astype(np.int64))

    @property
    def cache_keys(self) -> np.ndarray:
        """One key per user and epoch: a rebased history starts a key of its own."""
        return (self.epoch.astype(np.int64) << 32) | self.users.astype(np.int64)

    def accounts(self) -> VisitAccounts:
        """Every visit of the trace by kind, skipped ones included."""
        return VisitAccounts.of(self.kind, self.tokens, len(self.skipped_users), self.history_cap)

    def select(self, mine: np.ndarray, skipped: np.ndarray) -> Trace:
        """The visits where `mine` is true, and the skipped visits where `skipped` is."""
        columns = (self.users, self.times_ms, self.starts, self.first, self.history, self.candidates, self.kind,
                   self.epoch)
        return Trace(*(c[mine] for c in columns), history_cap=self.history_cap, policy=self.policy,
                     skipped_users=self.skipped_users[skipped], skipped_times_ms=self.skipped_times_ms[skipped])


def build_trace(store, candidates: int, limits: Limits, batch_size: int,
                policy: HistoryPolicy = HistoryPolicy(), users: np.ndarray | None = None) -> Trace:
    """Every visit with some history before it, of every user of `store` (or of the store
    indexes `users`: a shard's, so that its trace costs its share of memory), in time order.
    Histories are capped at the longest that lets `batch_size` users fit `limits.max_values`;
    `policy` says what a visit past that cap sends. Of a skipped visit only its user and time
    are kept, from the start: under NVIDIA's skip rule most visits of a long log are skipped."""
    cap = limits.history_cap(batch_size, candidates)
    skipped = KINDS.index("skipped")
    sent_columns: list[list[np.ndarray]] = [[] for _ in range(8)]  # users, times, starts, ends, first, history, kind, epoch
    skipped_columns: list[list[np.ndarray]] = [[] for _ in range(3)]  # users, times, starts
    for _, visits in _user_visits(store, cap, policy, users):
        sent = visits[6] != skipped
        every = bool(sent.all())
        for column, values in zip(sent_columns, visits):
            column.append(values if every else values[sent])
        if not every:
            for column, values in zip(skipped_columns, visits[:3]):
                column.append(values[~sent])
    sent_users, times, starts, ends, first, history, kind, epoch = _in_send_order(sent_columns, 8)
    skipped_users, skipped_times, _ = _in_send_order(skipped_columns, 3)
    return Trace(users=sent_users, times_ms=times, starts=starts, first=first, history=history,
                 candidates=np.minimum(ends - starts, candidates), kind=kind, epoch=epoch, history_cap=cap,
                 policy=policy, skipped_users=skipped_users, skipped_times_ms=skipped_times)


def _in_send_order(columns: list[list[np.ndarray]], width: int) -> list[np.ndarray]:
    """Per-user pieces joined and ordered by time, then user, then visit (columns 1, 0, 2), one
    column at a time so that only one extra column is ever held."""
    if not columns[0]:
        return [np.zeros(0, dtype=np.int64) for _ in range(width)]
    joined = []
    for pieces in columns:
        joined.append(np.concatenate(pieces))
        pieces.clear()
    order = np.lexsort((joined[2], joined[0], joined[1]))
    for i in range(width):
        joined[i] = joined[i][order]
    return joined


def first_visit_ms(store, candidates: int, limits: Limits, batch_size: int,
                   policy: HistoryPolicy = HistoryPolicy()) -> int | None:
    """The time of the whole store's first replayed visit (`build_trace(store, ...).times_ms[0]`),
    without holding the trace: the clock every shard of a replay starts from."""
    cap, first = limits.history_cap(batch_size, candidates), None
    skipped = KINDS.index("skipped")
    for _, (_, times, *_, kind, _) in _user_visits(store, cap, policy, None):
        sent = times[kind != skipped]
        if len(sent) and (first is None or sent[0] < first):
            first = int(sent[0])
    return first


def shard_users(users: int, index: int, count: int, stride: int = 1) -> np.ndarray:
    """The store indexes of shard `index` of `count` (see `shard_trace`), of `users` users."""
    every = np.arange(users, dtype=np.int64)
    return every if count <= 1 else every[(every // stride) % count == index]


def _user_visits(store, cap: int, policy: HistoryPolicy, users: np.ndarray | None):
    """(store index, its visit columns) of each user with a visit after its first. The times are
    read from the file, not through the memory map, so scanning every user leaves nothing resident."""
    offsets = np.asarray(store.offsets, dtype=np.int64)
    with _TimeReader(store.times_ms) as times_of:
        for u in range(len(store)) if users is None else (int(u) for u in users):
            t = times_of(int(offsets[u]), int(offsets[u + 1]))
            s = visit_starts(t)  # first visit (starting at 0) has no history: left out
            if len(s) == 0:
                continue
            yield u, tuple(np.asarray(values, dtype=np.int64) for values in (
                np.full(len(s), u, dtype=np.int64), t[s], s, np.append(s[1:], len(t)), *policy.plan_user(s, cap)))


class _TimeReader:
    """times[lo:hi] of a store's times_ms, read with a plain file read when it is a memory map."""

    def __init__(self, times: np.ndarray):
        self.times, self.file = times, None
        self.path, self.base = getattr(times, "filename", None), int(getattr(times, "offset", 0))

    def __enter__(self):
        if self.path is not None:
            self.file = open(self.path, "rb")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        if self.file is None:
            return np.asarray(self.times[lo:hi])
        self.file.seek(self.base + lo * self.times.itemsize)
        return np.fromfile(self.file, dtype=self.times.dtype, count=hi - lo)


def group_requests(trace: Trace, slice_ms: int, batch_size: int, servers: np.ndarray | None = None) -> np.ndarray:
    """Request boundaries: request r is trace[bounds[r]:bounds[r + 1]]. A request takes the
    consecutive visits of one time slice of `slice_ms` (0: one visit each), distinct users,
    at most `batch_size` of them; with `servers` (each visit's server, see `by_server`) all of one
    server."""
    n = len(trace)
    if slice_ms <= 0 or batch_size <= 1:
        return np.arange(n + 1, dtype=np.int64)
    slices = trace.times_ms // slice_ms
    server = np.zeros(n, dtype=np.int64) if servers is None else servers
    bounds = [0]
    members: set[int] = set()
    for i in range(n):
        user = int(trace.users[i])
        first = bounds[-1]
        if i > first and (slices[i] != slices[first] or server[i] != server[first] or user in members
                          or len(members) >= batch_size):
            bounds.append(i)
            members.clear()
        members.add(user)
    bounds.append(n)
    return np.asarray(bounds, dtype=np.int64)


def by_server(trace: Trace, user_servers: np.ndarray, slice_ms: int) -> tuple[Trace, np.ndarray]:
    """The trace with each time slice's visits ordered by their user's server (`user_servers`, by
    store index), stably, so that `group_requests` can form a request of one server's visits;
    and each visit's server. Without slices (one visit a request) the order is the log's."""
    servers = np.asarray(user_servers, dtype=np.int64)[trace.users]
    if slice_ms <= 0 or not len(trace):
        return trace, servers
    order = np.lexsort((np.arange(len(trace)), servers, trace.times_ms // slice_ms))
    columns = (trace.users, trace.times_ms, trace.starts, trace.first, trace.history, trace.candidates, trace.kind,
               trace.epoch)
    return (Trace(*(c[order] for c in columns), history_cap=trace.history_cap, policy=trace.policy,
                  skipped_users=trace.skipped_users, skipped_times_ms=trace.skipped_times_ms), servers[order])


def shard_trace(trace: Trace, index: int, count: int, stride: int = 1) -> Trace:
    """The visits of shard `index` of `count` of the users (store index // stride, modulo count),
    so one user's visits all go from one process, in order. A shard of a shard: `stride` is the
    first split's count, so the second split still divides the first shard's users."""
    if count <= 1:
        return trace
    return trace.select((trace.users // stride) % count == index, (trace.skipped_users // stride) % count == index)


def after_failures(trace: Trace, failed: np.ndarray) -> Trace:
    """The trace as a run that lost the visits where `failed` is true replays it: those visits
    got no answer (nothing cached, nothing counted) and each of their users continues on a fresh
    key at its next visit (`TimelineSource.settle`), so that visit hits nothing."""
    failed = np.asarray(failed, dtype=bool)
    if not failed.any():
        return trace
    lost = np.zeros(len(trace), dtype=np.int64)  # failures of the visit's user before it
    for u in np.unique(trace.users[failed]):
        mine = np.flatnonzero(trace.users == u)
        lost[mine] = np.cumsum(failed[mine]) - failed[mine]
    epoch = trace.epoch + lost * (int(trace.epoch.max()) + 1)  # one new epoch per (epoch, failures) pair
    return replace(trace, epoch=epoch).select(~failed, np.ones(len(trace.skipped_users), dtype=bool))


def visits_mask(trace: Trace, user_ids: np.ndarray, visits) -> np.ndarray:
    """The visits of `trace` named by (user id, visit time in ms) pairs, as a mask;
    `user_ids`: the store's user ids, by store index."""
    mask = np.zeros(len(trace), dtype=bool)
    for user_id, time_ms in visits:
        u = int(np.searchsorted(user_ids, int(user_id)))
        mask |= (trace.users == u) & (trace.times_ms == int(time_ms))
    return mask


class Timeline:
    """One process's natural replay, shared by its virtual users: the requests in order, when
    each goes, every user's cache key for the whole run, and which users have a request in flight
    (a user's next request waits for its last one: one key is never in flight twice, and a user's
    requests go in log order whichever virtual user takes them first)."""

    def __init__(self, store, trace: Trace, bounds: np.ndarray, candidates: int, limits: Limits,
                 time_scale: float = 0.0, request_rate: float = 0.0, start_ms: int | None = None,
                 user_servers: np.ndarray | None = None, waiting: Waiting = THREADS):
        self.store, self.trace, self.bounds, self.limits = store, trace, bounds, limits
        self.waiting = waiting  # how a taker waits for the requests before its own (the load test's greenlets)
        self.user_servers = user_servers  # a fleet's: store user -> the server its key lands on (None: any)
        # log time of the sweep's start: the whole trace's first visit, so shards keep one clock
        self.start_ms = int(trace.times_ms[0]) if start_ms is None else start_ms
        self.candidates, self.time_scale, self.request_rate = candidates, time_scale, request_rate
        self.next_request = 0
        self.keys: dict[int, int] = {}  # store user -> its cache key
        self.epochs: dict[int, int] = {}  # store user -> the key epoch its key serves (a rebase starts one)
        # visits skipped since the previous request (the last request takes those after it too)
        firsts = trace.times_ms[bounds[:-1]] if len(bounds) > 1 else np.zeros(0, dtype=np.int64)
        # (within a slice a fleet's requests go server by server: their first times need not ascend)
        before = np.maximum.accumulate(np.searchsorted(np.sort(trace.skipped_times_ms), firsts, side="right"))
        self.skipped = np.diff(before, prepend=0)
        if len(self.skipped):
            self.skipped[-1] += len(trace.skipped_times_ms) - before[-1]
        self.held: dict[int, int] = {}  # store user -> tokens its key held after its last answer
        self._settled: dict[int, object] = {}  # request taken and not yet settled -> event set when it is
        self._latest: dict[int, object] = {}  # store user -> that event of its latest request taken
        self._users: dict = {}  # store user -> its history as plain views of the store's maps (see `user`)

    def user(self, index: int):
        """Store user `index`, read once: a store read builds memory-map views (~25 us each, one per
        visit otherwise); plain views of the same maps cost nothing to keep and little to slice."""
        found = self._users.get(index)
        if found is None:
            h = self.store.user(index)
            found = self._users[index] = replace(h, video_ids=np.asarray(h.video_ids), actions=np.asarray(h.actions),
                                                 times_ms=np.asarray(h.times_ms))
        return found

    @property
    def requests(self) -> int:
        return len(self.bounds) - 1

    @property
    def exhausted(self) -> bool:
        return self.next_request >= self.requests

    def send_at_s(self, r: int) -> float | None:
        """Seconds after the start at which request r goes (None: as soon as it can)."""
        if self.time_scale > 0:
            return float(self.trace.times_ms[self.bounds[r]] - self.start_ms) / 1e3 / self.time_scale
        if self.request_rate > 0:
            return r / self.request_rate
        return None

    def take(self) -> int:
        """The next request's index; waits until every earlier request of its users has settled.

        The request is queued behind them before it waits, so a request taken later for one of its
        users waits for this one too: a user's visits reach the server in log order."""
        if self.next_request >= self.requests:
            raise PlanError(f"the trace's {self.requests} requests have all been sent")
        r, self.next_request = self.next_request, self.next_request + 1
        before = {id(e): e for u in self.users_of(r) if (e := self._latest.get(u)) is not None}
        mine = self._settled[r] = self.waiting.event()
        for u in self.users_of(r):
            self._latest[u] = mine
        try:
            for event in before.values():
                event.wait()
        except BaseException:  # stopped while waiting: it settles once what it waited for has
            self.waiting.spawn(self._release_after, r, list(before.values()))
            raise
        return r

    def _release_after(self, r: int, events: list) -> None:
        for event in events:
            event.wait()
        self.release(r)

    def release(self, r: int) -> None:
        """Request r has settled (answered, failed or not sent): the next request of its users may go."""
        event = self._settled.pop(r, None)
        if event is None:
            return
        event.set()
        for u in self.users_of(r):
            if self._latest.get(u) is event:
                del self._latest[u]

    def users_of(self, r: int) -> list[int]:
        """The store users request r visits."""
        return [int(u) for u in self.trace.users[self.bounds[r]:self.bounds[r + 1]]]


class TimelineSource:
    """One virtual user's share of the natural replay: it takes the next request in order."""

    def __init__(self, timeline: Timeline, keys: KeyAllocator):
        self.timeline, self.keys = timeline, keys
        self.retired = RetiredKeys()

    @property
    def exhausted(self) -> bool:
        """Every request of the trace was handed out: nothing more to send."""
        return self.timeline.exhausted

    def next_step(self, target: float, batch_size: int) -> PlannedStep:
        t, tl = self.timeline.trace, self.timeline
        r = tl.take()
        rows = slice(int(tl.bounds[r]), int(tl.bounds[r + 1]))
        # the step's visits as plain ints, one conversion per column instead of one per field and visit
        visit_users = t.users[rows].tolist()
        visits = zip(visit_users, t.epoch[rows].tolist(), t.first[rows].tolist(), t.history[rows].tolist(),
                     t.starts[rows].tolist(), t.candidates[rows].tolist(), t.times_ms[rows].tolist(),
                     t.kind[rows].tolist())
        users, hits, labels = [], [], []
        for u, epoch, f, h, s, c, time_ms, kind in visits:
            if u in tl.keys and tl.epochs[u] != epoch:  # rebased: what the key holds is no prefix of it
                self.retired.add(tl.keys.pop(u))
            if u not in tl.keys:
                server = None if tl.user_servers is None else int(tl.user_servers[u])
                tl.keys[u], tl.held[u], tl.epochs[u] = self.keys.new_key(server), 0, epoch
            history = tl.user(u)
            users.append(UserRequest(
                user_id=history.user_id, context=history.context,
                history_items=np.asarray(history.video_ids[f:f + h], dtype=np.int64),
                history_actions=np.asarray(history.actions[f:f + h], dtype=np.int64),
                candidates=np.asarray(history.video_ids[s:s + c], dtype=np.int64),
                cache_key=tl.keys[u]))
            hits.append(tl.held[u])
            labels.append(f"user {history.user_id} visit at {time_ms} ms items {h} {KINDS[kind]}")
        if tl.skipped[r]:
            n = int(tl.skipped[r])
            labels.append(f"skipped {n} visits {n * history_tokens(t.history_cap)} tokens")
        try:
            request = build_request(users, tl.limits)
        except HstuReplayError:
            tl.release(r)
            raise
        return PlannedStep(request=request, expected_hits=tuple(hits), label="; ".join(labels),
                           goal_ratio=target, handles=(r,), send_at_s=tl.send_at_s(r))

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        """A failed request leaves its users' server state unknown: they get fresh keys."""
        tl = self.timeline
        (r,) = step.handles
        users = tl.users_of(r)
        for u, tokens in zip(users, step.request.total_history_lengths.tolist()):
            if ok:
                tl.held[u] = int(tokens)
            elif u in tl.keys:
                self.retired.add(tl.keys.pop(u))
        tl.release(r)
        return self.retired.take()

    def reset(self) -> None:
        """The server lost its cache: every user starts a fresh key at its next visit."""
        tl = self.timeline
        self.retired.extend(tl.keys.values())
        tl.keys.clear()
        tl.held.clear()


_SENT = re.compile(r"items (\d+) (" + "|".join(KINDS) + r")\b")
_VISIT = re.compile(r"user (-?\d+) visit at (-?\d+) ms")
_SKIPPED = re.compile(r"skipped (\d+) visits (\d+) tokens")


def label_accounts(label: str) -> VisitAccounts:
    """The visits a request's label (`TimelineSource.next_step`) names, by kind."""
    visits, tokens = [0] * len(KINDS), [0] * len(KINDS)
    for items, kind in _SENT.findall(label):
        visits[KINDS.index(kind)] += 1
        tokens[KINDS.index(kind)] += history_tokens(int(items))
    for n, skipped_tokens in _SKIPPED.findall(label):
        visits[KINDS.index("skipped")] += int(n)
        tokens[KINDS.index("skipped")] += int(skipped_tokens)
    return VisitAccounts(tuple(visits), tuple(tokens))


def label_visits(label: str) -> list[tuple[int, int]]:
    """The (user id, visit time in ms) of each visit a request's label names."""
    return [(int(u), int(t)) for u, t in _VISIT.findall(label)]
