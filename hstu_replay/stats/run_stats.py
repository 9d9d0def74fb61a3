"""Per-bin counters and latency histograms of a run; they merge by addition across workers.

A bin is one (batch size, target hit ratio) stage of a sweep. Latencies come from measured
requests only; the priming requests a stage needed are counted in its bin beside them (the
server did that work too), warm-up requests apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from hstu_replay.stats.causes import ErrorCause, cause_of
from hstu_replay.stats.histogram import LatencyHistogram

MAX_ERROR_REASONS = 100  # distinct failure causes kept per process; the rest are pooled
FURTHER_CAUSES = "(further distinct causes not listed)"


def ratio_name(ratio: float) -> str:
    """Two decimals where they are exact (0.50), else every digit needed (0.949): no two
    distinct target ratios share a name."""
    short = f"{ratio:.2f}"
    return short if float(short) == ratio else repr(float(ratio))


#: The goal ratio of a natural-replay stage: none, the ratio emerges. Every NaN a key is made with
#: becomes this one object, so that keys equal once a NaN crossed the wire (NaN != NaN, and its hash
#: is its identity).
NATURAL = float("nan")


@dataclass(frozen=True, order=True)
class BinKey:
    batch_size: int
    goal_ratio: float

    def __post_init__(self) -> None:
        if math.isnan(self.goal_ratio):
            object.__setattr__(self, "goal_ratio", NATURAL)

    def name(self) -> str:
        if math.isnan(self.goal_ratio):  # natural replay: no target, the ratio emerges
            return f"b{self.batch_size}_natural"
        return f"b{self.batch_size}_h{ratio_name(self.goal_ratio)}"


@dataclass
class BinStats:
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # from the actual send
    corrected: LatencyHistogram = field(default_factory=LatencyHistogram)  # from the intended send (open loop)
    lag: LatencyHistogram = field(default_factory=LatencyHistogram)  # actual - intended send (open loop)
    loop_lag: LatencyHistogram = field(default_factory=LatencyHistogram)  # the client's event loop, late by
    client_cpu_s: float = 0.0  # load generator CPU over the measured window, all its processes
    client_wall_s: float = 0.0  # ... and the wall time it was sampled over, summed alike
    client_cpu_peak: float = 0.0  # highest CPU utilisation of one load-generator process (1.0 = a core)
    server_down_s: float = 0.0  # time the server was unreachable, from the first failed to the next answer
    requests: int = 0  # measured requests that got a response
    errors: int = 0  # measured requests that got none (error, timeout, malformed answer)
    logical_requests: int = 0  # users served (batch members)
    history_tokens: int = 0
    computed_tokens: int = 0  # history tokens the server had to compute (not found cached)
    prime_requests: int = 0  # priming requests this stage's measured requests needed
    prime_failures: int = 0
    prime_tokens: int = 0  # history tokens those primes made the server compute
    expected_hits: int = 0  # what the plan aimed at
    predicted_hits: int = 0  # what the capacity model says the server held
    observed_hits: int = 0  # what the server reported (where it reports)
    observed_tokens: int = 0  # history tokens of requests with a server report
    hit_disagreements: int = 0  # requests whose reported hits differ from the prediction
    hits_lost: int = 0  # requests that found less cached than predicted (a restart, a foreign eviction)
    # two cache tiers: hits onboarded from the host, and users per tier (GPU hit, host hit, miss)
    predicted_host_hits: int = 0
    observed_host_hits: int = 0  # where the server sends HOST_CACHED_TOKENS
    observed_tier_tokens: int = 0  # history tokens of requests with that report
    predicted_gpu_users: int = 0
    predicted_host_users: int = 0
    predicted_miss_users: int = 0
    observed_gpu_users: int = 0
    observed_host_users: int = 0
    observed_miss_users: int = 0
    verified: int = 0
    mismatches: int = 0  # answered, but wrong: also failures
    first_start: float = math.inf  # epoch seconds
    last_end: float = 0.0

    def merge(self, other: BinStats) -> None:
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, LatencyHistogram):
                mine.merge(theirs)
            elif f.name in MERGE_MIN:
                setattr(self, f.name, min(mine, theirs))
            elif f.name in MERGE_MAX:
                setattr(self, f.name, max(mine, theirs))
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in HISTOGRAMS:
            d[name] = getattr(self, name).to_dict()
        d["first_start"] = None if math.isinf(self.first_start) else self.first_start
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BinStats:
        values = dict(d)
        for name in HISTOGRAMS:
            values[name] = LatencyHistogram.from_dict(d[name])
        values["first_start"] = math.inf if d["first_start"] is None else d["first_start"]
        return cls(**values)

    def add_tier_user(self, source: str, tier, users: int = 1) -> None:
        """Users of a measured request, by where their reuse came from (`source`: predicted or observed)."""
        name = f"{source}_{tier.value}_users"
        setattr(self, name, getattr(self, name) + users)

    # -- derived figures --------------------------------------------------------------

    @property
    def predicted_ratio(self) -> float:
        return self.predicted_hits / self.history_tokens if self.history_tokens else math.nan

    @property
    def observed_ratio(self) -> float:
        return self.observed_hits / self.observed_tokens if self.observed_tokens else math.nan

    @property
    def hit_source(self) -> str | None:
        """Where the achieved ratio comes from: `observed` (the server reported the hits of every
        measured request), `predicted` (the client's model of the server's cache), or None."""
        if not self.history_tokens:
            return None
        return "observed" if self.observed_tokens == self.history_tokens else "predicted"

    @property
    def achieved_ratio(self) -> float:
        """The server's word where it reported the hits of every measured request, else the
        client's model (see `hit_source`)."""
        return self.observed_ratio if self.hit_source == "observed" else self.predicted_ratio

    @property
    def failures(self) -> int:
        """Measured requests that failed: no answer, or a wrong one."""
        return self.errors + self.mismatches

    @property
    def duration_s(self) -> float:
        return max(self.last_end - self.first_start, 0.0) if self.requests else 0.0

    @property
    def throughput(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else math.nan


HISTOGRAMS = ("latency", "corrected", "lag", "loop_lag")
MERGE_MIN = {"first_start"}  # fields that merge by min / max instead of addition
MERGE_MAX = {"last_end", "client_cpu_peak"}


@dataclass
class RunStats:
    bins: dict[BinKey, BinStats] = field(default_factory=dict)
    warmup_requests: int = 0
    errors: dict[str, ErrorCause] = field(default_factory=dict)  # a failure's cause (causes.cause_of) -> count, example
    servers: dict[tuple[BinKey, int], BinStats] = field(default_factory=dict)  # a fleet's: (stage, server)

    def bin(self, key: BinKey) -> BinStats:
        if key not in self.bins:
            self.bins[key] = BinStats()
        return self.bins[key]

    def server_bin(self, key: BinKey, server: int) -> BinStats:
        """Stage `key`'s figures at server `server` of a fleet (beside the stage's own)."""
        at = (key, server)
        if at not in self.servers:
            self.servers[at] = BinStats()
        return self.servers[at]

    def count_error(self, message: str) -> None:
        """One failure, counted under its cause; the first message of a cause is its example."""
        cause = cause_of(message)
        if cause not in self.errors and len(self.errors) >= MAX_ERROR_REASONS:
            cause = FURTHER_CAUSES
        self._add_error(cause, ErrorCause(1, message))

    def _add_error(self, cause: str, counted: ErrorCause) -> None:
        mine = self.errors.get(cause)
        if mine is None:
            self.errors[cause] = ErrorCause(counted.count, counted.example)
        else:
            mine.count += counted.count

    def merge(self, other: RunStats) -> None:
        for key, stats in other.bins.items():
            self.bin(key).merge(stats)
        for (key, server), stats in other.servers.items():
            self.server_bin(key, server).merge(stats)
        self.warmup_requests += other.warmup_requests
        for cause, counted in other.errors.items():
            self._add_error(cause, counted)

    def to_dict(self) -> dict:
        return {
            "bins": [[k.batch_size, k.goal_ratio, v.to_dict()] for k, v in sorted(self.bins.items())],
            "warmup_requests": self.warmup_requests,
            "errors": {cause: counted.to_dict() for cause, counted in self.errors.items()},
            "servers": [[k.batch_size, k.goal_ratio, i, v.to_dict()] for (k, i), v in sorted(self.servers.items())],
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunStats:
        return cls(
            bins={BinKey(int(b), float(r)): BinStats.from_dict(v) for b, r, v in d["bins"]},
            warmup_requests=d["warmup_requests"],
            errors={cause: ErrorCause.from_dict(counted) for cause, counted in d["errors"].items()},
            servers={(BinKey(int(b), float(r)), int(i)): BinStats.from_dict(v) for b, r, i, v in d.get("servers", ())},
        )

    def take(self) -> RunStats:
        """Return what was gathered since the last take and start afresh (for worker reports)."""
        taken = RunStats(self.bins, self.warmup_requests, self.errors, self.servers)
        self.bins, self.errors, self.servers = {}, {}, {}
        self.warmup_requests = 0
        return taken
