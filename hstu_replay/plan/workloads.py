"""The workloads a run replays, by name (`--workload`): the registry `WORKLOADS`.

Each is declared once (`WorkloadKind`): its name, the option naming its data, and what sets it
apart (a natural replay keeps the log's own times and lets the hit ratio emerge). A workload
opens its data once per process, checks it against the run's batch sizes and limits before any
load (one line naming what and where), and makes one step source per virtual user. Every source
of a process shares its dealer, so no two slots replay one user. Adding a workload is one class
and one `WorkloadKind` here; nothing else names workloads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hstu_replay.errors import ConfigError, opened_by_option
from hstu_replay.interface import Limits
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.over_limit import HistoryPolicy
from hstu_replay.plan.reuse import HitMix, PartialHits
from hstu_replay.plan.step import PlannedStep
from hstu_replay.plan.tier_mix import TierMix
from hstu_replay.plan.waiting import THREADS, Waiting

if TYPE_CHECKING:
    from hstu_replay.plan.dumps import KnownAnswer


class StepSource(Protocol):
    """One virtual user's stream of steps."""

    @property
    def exhausted(self) -> bool:
        """True once the source has nothing more to send (a natural replay's log ran out);
        a source that never runs dry says False."""

    def next_step(self, target: float, batch_size: int) -> PlannedStep: ...

    def settle(self, step: PlannedStep, ok: bool) -> list[int]:
        """After the step (`ok`: answered); returns the cache keys never to be sent again."""

    def reset(self) -> None: ...


@dataclass(frozen=True)
class WorkloadOptions:
    path: str  # the store or the dump directory
    candidates: int
    limits: Limits
    seed: int = 0
    worker_index: int = 0
    worker_count: int = 1
    time_scale: float = 0.0  # natural replay: log time / this; 0: by request_rate or back to back
    request_rate: float = 0.0
    slice_ms: int = 0  # natural replay: visits of one slice share a request (0: one visit each)
    shard: tuple[int, int] = (0, 1)  # natural replay: only users i of n (store index modulo n)
    policy: HistoryPolicy = HistoryPolicy()  # natural replay: a visit whose history is past the limit
    tier_mix: TierMix | None = None  # steer each slot to a cache tier (sessions)
    working_set: int = 0  # sessions: N keys per virtual user revisited round-robin (0: off)
    user_servers: Callable[[np.ndarray], np.ndarray] | None = None  # natural replay over a fleet by key:
    # store indices -> each user's server (a request's users then share one)
    partial_hits: PartialHits = PartialHits.PRIME  # dumps: ratios between 0 and 1 from primes or from reuse
    waiting: Waiting = THREADS  # natural replay: how its virtual users wait their turn (the load test's greenlets)


class Workload(Protocol):
    def check(self, batch_sizes: tuple[int, ...]) -> None: ...

    def known_answers(self, batch_size: int, count: int, keys: KeyAllocator) -> list[KnownAnswer]:
        """Up to `count` cold requests whose answers the data holds (`plan.dumps.KnownAnswer`), to be
        compared before any load; none where the data holds no answers."""

    def source(self, keys: KeyAllocator, cache=None) -> StepSource:
        """One virtual user's source; `cache` is the process's model of the server's cache."""


class SessionWorkload:
    flag = "--store"

    def __init__(self, options: WorkloadOptions):
        from hstu_replay.data.store import open_store
        from hstu_replay.plan.sessions import usable_users

        self.options = options
        self.store = open_store(options.path, self.flag)
        users = usable_users(self.store, options.candidates)
        if not users:
            raise ConfigError(f"--store {options.path}: no user has more than {options.candidates} events; "
                              "lower --candidates")
        self.dealer = Dealer(users, options.seed, options.worker_index, options.worker_count)
        self.working_set: tuple[int, list[int]] | None = None  # (history items, users of the entries)

    def check(self, batch_sizes: tuple[int, ...]) -> None:
        o = self.options
        if o.working_set:
            from hstu_replay.plan.working_set import working_set_plan

            self.working_set = working_set_plan(self.store, o.working_set, batch_sizes, o.limits, o.candidates,
                                                self.dealer.order)
        for batch in batch_sizes:
            if len(self.dealer) < batch:
                raise ConfigError(f"--store {o.path}: {len(self.dealer)} usable users cannot fill a batch of "
                                  f"{batch} distinct users")
            if self.history_cap(batch) < 1:
                raise ConfigError(f"--max-values {o.limits.max_values}: no room for any history at batch {batch} "
                                  f"with --candidates {o.candidates}")

    def history_cap(self, batch_size: int) -> int:
        return self.options.limits.history_cap(batch_size, self.options.candidates)

    def known_answers(self, batch_size: int, count: int, keys: KeyAllocator) -> list[KnownAnswer]:
        return []

    def source(self, keys: KeyAllocator, cache=None) -> StepSource:
        from hstu_replay.plan.sessions import SessionSource, TierSteering

        o = self.options
        if o.working_set:
            from hstu_replay.plan.working_set import WorkingSetSource

            if self.working_set is None:
                raise ConfigError("--working-set: checked against the batch sizes before any source")
            items, users = self.working_set
            return WorkingSetSource(self.store, users, items, keys, o.candidates, o.limits, cache)
        steering = TierSteering(o.tier_mix, cache) if o.tier_mix is not None and cache is not None else None
        return SessionSource(self.store, self.dealer, keys, o.candidates, o.limits, steering)


class DumpWorkload:
    flag = "--dump-dir"

    def __init__(self, options: WorkloadOptions):
        from hstu_replay.dumps.reader import read_dump
        from hstu_replay.plan.dumps import dumped_users, pool_identities

        self.options = options
        self.pool = dumped_users(opened_by_option(self.flag, options.path, read_dump))
        if not self.pool:
            raise ConfigError(f"--dump-dir {options.path}: holds no dumped users")
        self.dealer = Dealer(range(len(self.pool)), options.seed, options.worker_index, options.worker_count,
                             identities=pool_identities(self.pool))
        self.held: dict[int, dict] = {}  # per server's cache model: dumped user -> key holding its full
        # history (see DumpSource); keys are shared only among the sources that send to one server
        self.mix = HitMix() if options.partial_hits is PartialHits.REUSE else None  # the process's hit tally

    def check(self, batch_sizes: tuple[int, ...]) -> None:
        o, limits = self.options, self.options.limits
        for d in self.pool:
            u = d.request
            if u.history_length > limits.max_history or len(u.candidates) > limits.max_candidates:
                raise ConfigError(f"--dump-dir {o.path}: {d.label} has {u.history_length} history items and "
                                  f"{len(u.candidates)} candidates; limits {limits.max_history} and "
                                  f"{limits.max_candidates} (raise --max-history)")
        sizes = sorted((d.request.num_values for d in self.pool), reverse=True)
        distinct = len(set(self.dealer.identities))
        for batch in batch_sizes:
            if distinct < batch:
                raise ConfigError(f"--dump-dir {o.path}: {distinct} distinct users cannot fill a batch of {batch}")
            if sum(sizes[:batch]) > limits.max_values:
                raise ConfigError(f"--dump-dir {o.path}: the {batch} largest dumped users make a request of "
                                  f"{sum(sizes[:batch])} values; --max-values is {limits.max_values} "
                                  f"(dumped values cannot be trimmed: lower the batch size or raise --max-values)")

    def known_answers(self, batch_size: int, count: int, keys: KeyAllocator) -> list[KnownAnswer]:
        from hstu_replay.plan.dumps import known_answers

        return known_answers(self.pool, batch_size, count, keys, self.options.limits)

    def source(self, keys: KeyAllocator, cache=None) -> StepSource:
        from hstu_replay.plan.dumps import DumpSource

        return DumpSource(self.pool, self.dealer, self.held.setdefault(id(cache), {}), keys, self.options.limits,
                          self.mix)


class TimelineWorkload:
    """Natural replay: every user's visits in the log's time order, each user on one key."""

    flag = "--store"

    def __init__(self, options: WorkloadOptions):
        from hstu_replay.data.store import open_store

        self.options = options
        self.store = open_store(options.path, self.flag)
        self.timeline = None

    def check(self, batch_sizes: tuple[int, ...]) -> None:
        from hstu_replay.plan.timeline import (
            Timeline, build_trace, by_server, first_visit_ms, group_requests, shard_users,
        )

        o = self.options
        if len(batch_sizes) != 1:
            raise ConfigError(f"--workload timeline replays the log once: give one batch size, not {batch_sizes}")
        (batch,) = batch_sizes
        if self.history_cap(batch) < 1:
            raise ConfigError(f"--max-values {o.limits.max_values}: no room for any history at batch {batch} "
                              f"with --candidates {o.candidates}")
        # only this shard's and worker's users are read: the trace costs their share of the log
        mine = shard_users(len(self.store), *o.shard)
        mine = mine[np.isin(mine, shard_users(len(self.store), o.worker_index, o.worker_count, stride=o.shard[1]))]
        trace = build_trace(self.store, o.candidates, o.limits, batch, o.policy, users=mine)
        if not len(trace):
            raise ConfigError(f"--store {o.path}: no user (of this shard and worker) comes back after a gap of 60 s: "
                              "nothing to replay")
        user_servers = visit_servers = None
        if o.user_servers is not None:
            user_servers = o.user_servers(np.arange(len(self.store), dtype=np.int64))
            trace, visit_servers = by_server(trace, user_servers, o.slice_ms)
        self.timeline = Timeline(self.store, trace, group_requests(trace, o.slice_ms, batch, visit_servers),
                                 o.candidates, o.limits, o.time_scale, o.request_rate,
                                 start_ms=first_visit_ms(self.store, o.candidates, o.limits, batch, o.policy),
                                 user_servers=user_servers, waiting=o.waiting)

    def history_cap(self, batch_size: int) -> int:
        return self.options.limits.history_cap(batch_size, self.options.candidates)

    def known_answers(self, batch_size: int, count: int, keys: KeyAllocator) -> list[KnownAnswer]:
        return []

    def source(self, keys: KeyAllocator, cache=None) -> StepSource:
        from hstu_replay.plan.timeline import TimelineSource

        if self.timeline is None:
            raise ConfigError("--workload timeline: checked against a batch size before any source")
        return TimelineSource(self.timeline, keys)


@dataclass(frozen=True)
class WorkloadKind:
    """A `--workload`, as the rest of the run sees it."""

    name: str
    opens: Callable[[WorkloadOptions], Workload]
    data_option: str  # the option naming its data: "store" or "dump_dir"
    data_needed: str  # what the error says is missing when that option is empty
    help: str  # one phrase for --workload's help
    steers_tiers: bool = False  # takes --tier-mix
    mixes_hits: bool = False  # takes --partial-hits reuse (partial ratios from full hits and misses, no primes)
    caps_histories: bool = True  # cuts histories to fit --max-history / --max-values (dumps are sent as dumped)
    natural: bool = False  # replays the log's own times: its steps say when they go (no arrival clock),
    # one stage whose hit ratio emerges, --time-scale / --timeline-shard apply, a natural report section;
    # its sources run dry when the log ends (StepSource.exhausted)

    @property
    def data_flag(self) -> str:
        return "--" + self.data_option.replace("_", "-")


#: --workload name -> its declaration
WORKLOADS: dict[str, WorkloadKind] = {k.name: k for k in (
    WorkloadKind("sessions", SessionWorkload, "store", "--store (a prepared KuaiRand store)",
                 "sessions (replay a prepared store)", steers_tiers=True),
    WorkloadKind("dumps", DumpWorkload, "dump_dir", "--dump-dir", "dumps (NVIDIA dump dir)",
                 caps_histories=False, mixes_hits=True),
    WorkloadKind("timeline", TimelineWorkload, "store", "--store (a prepared KuaiRand store)",
                 "timeline (natural replay of a store in the log's time order)", natural=True),
)}


def one_of(names) -> str:
    """'a, b or c'."""
    names = list(names)
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


def workload_kind(name: str) -> WorkloadKind:
    if name not in WORKLOADS:
        raise ConfigError(f"--workload {name!r}: use {one_of(WORKLOADS)}")
    return WORKLOADS[name]


def natural_workloads() -> str:
    """The --workload values that replay the log's own times, for messages ('timeline')."""
    return one_of(k.name for k in WORKLOADS.values() if k.natural)


def open_workload(name: str, options: WorkloadOptions) -> Workload:
    return workload_kind(name).opens(options)
