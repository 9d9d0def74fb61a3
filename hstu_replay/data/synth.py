"""Synthetic KuaiRand-1K raw files: the published schema and quoting, with a realistic shape.

The real data cannot be downloaded here, so tests, demos and benchmarks run on files written by
`synthesize`: the two standard logs, the random-exposure log and user_features_1k.csv, byte-level
compatible with the published ones (header unquoted, integers bare, range strings with commas
quoted). Shape: lognormal history lengths per user, a truncated power law (Zipf-like) over a
video id space, sessions of back-to-back plays separated by breaks of minutes to hours, and
action rates near the published ones. A few users appear in one period only, so the inner join
of the two periods has something to drop. Output depends only on (users, seed, scale).

Everything is vectorized numpy over chunks of users (about a million events each), so the
full-size preset (1,000 users, ~11.7M standard events, ~850 MB) stays well under a GB of memory.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hstu_replay.data import schema

#: Published size of KuaiRand-1K; `events_per_user_scale=1.0` reproduces its per-user volume.
FULL_USERS = schema.RELEASES["1k"].users
FULL_STANDARD_EVENTS = schema.RELEASES["1k"].standard_events
FULL_RANDOM_EVENTS = 43_028
FULL_VIDEO_SPACE = 7_583_634  # video ids of the 27K release the 1K users draw from
USER_ID_SPACE = 27_285  # user ids of the 27K release

#: Exponent of the rank distribution; 0.715 gives ~4.37M distinct videos in 11.7M plays.
ZIPF_EXPONENT = 0.715
HISTORY_SIGMA = 0.9  # lognormal spread of events per user
PERIOD1_SHARE = 0.43  # share of a user's events in the first log (368 MB of 849 MB)
SESSION_MEAN_EVENTS = 25
TIE_PROBABILITY = 0.002  # events logged in the same millisecond as the previous one
CHUNK_EVENTS = 1 << 20

_UTC8 = dt.timezone(dt.timedelta(hours=8))
_TAB_WEIGHTS = np.array([12, 60, 8, 6, 4, 3, 2, 1, 1, 1, 0.5, 0.5, 0.4, 0.3, 0.3])
_LOG_TYPES = {name: np.int64 for name in schema.LOG_COLUMNS}


@dataclass(frozen=True)
class Period:
    """A log's date range, in Beijing time as the dataset's date/hourmin columns are."""

    first_day: dt.date
    days: int

    @property
    def start_ms(self) -> int:
        start = dt.datetime.combine(self.first_day, dt.time(), tzinfo=_UTC8)
        return int(start.timestamp() * 1000)

    @property
    def length_ms(self) -> int:
        return self.days * 86_400_000

    def yyyymmdd(self) -> np.ndarray:
        days = (self.first_day + dt.timedelta(days=i) for i in range(self.days + 1))
        return np.array([d.year * 10_000 + d.month * 100 + d.day for d in days], dtype=np.int64)


PERIOD1 = Period(dt.date(2022, 4, 8), 14)
PERIOD2 = Period(dt.date(2022, 4, 22), 17)


@dataclass(frozen=True)
class SynthReport:
    """What `synthesize` wrote."""

    out_dir: Path
    users: int
    standard_events: int
    random_events: int
    file_sizes: dict[str, int]

    def line(self) -> str:
        mb = sum(self.file_sizes.values()) / 1e6
        return (
            f"wrote {self.out_dir}: {self.users} users, {self.standard_events} standard events, "
            f"{self.random_events} random-log events, {mb:.1f} MB"
        )


@dataclass(frozen=True)
class _Users:
    """Per-user draws: ids and event counts in each log."""

    ids: np.ndarray
    period1: np.ndarray
    period2: np.ndarray
    random: np.ndarray


def full_size(release: schema.Release) -> tuple[int, float]:
    """(users, events_per_user_scale) of a release's published size."""
    per_user = release.standard_events / release.users
    return release.users, per_user / (FULL_STANDARD_EVENTS / FULL_USERS)


def synthesize(
    out_dir: str | Path,
    users: int,
    seed: int,
    events_per_user_scale: float = 1.0,
    release: str = schema.DEFAULT_RELEASE,
) -> SynthReport:
    """Write a release's raw files into `out_dir` (created; existing files replaced).

    `events_per_user_scale` scales the published mean of ~11.7k standard events per user (and
    the video id space with it); 1.0 with 1,000 users is the full-size 1K dataset. A release with
    part files gets each standard log split by rows into its published number of equal parts
    (a user's rows may straddle two); only the names and that split differ between releases, the rows are the same.
    Chunks of about a million events are drawn and written one at a time, so memory stays flat.
    """
    if users < 1:
        raise ValueError("users must be >= 1")
    if events_per_user_scale <= 0:
        raise ValueError("events_per_user_scale must be > 0")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 0])
    drawn = _draw_users(rng, users, events_per_user_scale)
    total = int(drawn.period1.sum() + drawn.period2.sum())
    video_space = max(1_000, round(FULL_VIDEO_SPACE * total / FULL_STANDARD_EVENTS))
    layout = schema.RELEASES[release]
    _write_user_features(out / layout.user_features, rng, drawn.ids)

    parts = max(1, layout.parts)
    logs = [
        ([layout.part_name(0, k) for k in range(parts)], drawn.period1, PERIOD1, False),
        ([layout.part_name(1, k) for k in range(parts)], drawn.period2, PERIOD2, False),
        ([layout.random_log], drawn.random, PERIOD2, True),
    ]
    sinks = {name: _open_log(out / name) for names, *_ in logs for name in names}
    try:
        per_user = drawn.period1 + drawn.period2 + drawn.random
        for chunk, users_in_chunk in enumerate(_chunks(per_user, CHUNK_EVENTS)):
            for log_index, (names, counts, period, random_exposure) in enumerate(logs):
                chunk_rng = np.random.default_rng([seed, 1, chunk, log_index])
                columns = _events(
                    chunk_rng,
                    drawn.ids[users_in_chunk],
                    counts[users_in_chunk],
                    period,
                    video_space,
                    random_exposure,
                )
                first = int(counts[: users_in_chunk[0]].sum())
                for name, (lo, hi) in _parts(names, first, len(columns["user_id"]), int(counts.sum())):
                    _write_rows(sinks[name], {k: v[lo:hi] for k, v in columns.items()})
    finally:
        for sink in sinks.values():
            sink.close()
    sizes = {name: (out / name).stat().st_size for name in [*sinks, layout.user_features]}
    return SynthReport(out, users, total, int(drawn.random.sum()), sizes)


def _parts(names: list[str], first: int, rows: int, total: int):
    """(part file, (lo, hi)) of a chunk's rows `first`.. of a log of `total` rows split evenly."""
    for k, name in enumerate(names):
        start, stop = total * k // len(names), total * (k + 1) // len(names)
        lo, hi = max(start - first, 0), min(stop - first, rows)
        if lo < hi:
            yield name, (lo, hi)


def _draw_users(rng: np.random.Generator, users: int, scale: float) -> _Users:
    space = max(USER_ID_SPACE, 4 * users)
    ids = np.sort(rng.choice(space, size=users, replace=False)).astype(np.int64)
    target = round(FULL_STANDARD_EVENTS / FULL_USERS * scale * users)
    weights = rng.lognormal(0.0, HISTORY_SIGMA, users)
    lengths = np.maximum(2, np.round(weights / weights.sum() * target)).astype(np.int64)
    share = rng.beta(PERIOD1_SHARE * 20, (1 - PERIOD1_SHARE) * 20, users)
    period1 = np.clip(np.round(lengths * share), 1, lengths - 1).astype(np.int64)
    period2 = lengths - period1
    # A few users log in one period only: the inner join of the periods drops them.
    one_sided = max(1, users // 200) if users >= 4 else 0
    picked = rng.choice(users, size=2 * one_sided, replace=False)
    only1, only2 = picked[:one_sided], picked[one_sided:]
    period1[only1], period2[only1] = lengths[only1], 0
    period1[only2], period2[only2] = 0, lengths[only2]
    random_mean = max(FULL_RANDOM_EVENTS / FULL_USERS * scale, 2.0)  # keep the log non-empty
    random = rng.poisson(random_mean, users).astype(np.int64)
    random[period2 == 0] = 0
    return _Users(ids, period1, period2, random)


def _chunks(per_user: np.ndarray, limit: int):
    """Consecutive user index ranges holding about `limit` events each (at least one user)."""
    start, acc = 0, 0
    for i, n in enumerate(per_user.tolist()):
        if acc and acc + n > limit:
            yield np.arange(start, i)
            start, acc = i, 0
        acc += n
    if start < len(per_user):
        yield np.arange(start, len(per_user))


def _events(
    rng: np.random.Generator,
    user_ids: np.ndarray,
    counts: np.ndarray,
    period: Period,
    video_space: int,
    random_exposure: bool,
) -> dict[str, np.ndarray]:
    """One log's rows for a chunk of users: user-major, each user's rows in time order."""
    keep = counts > 0
    user_ids, counts = user_ids[keep], counts[keep]
    n = int(counts.sum())
    if n == 0:
        return {name: np.zeros(0, dtype) for name, dtype in _LOG_TYPES.items()}
    if random_exposure:
        videos = rng.integers(0, video_space, n)
    else:
        videos = _popular_videos(rng, n, video_space)
    duration = _duration_ms(videos)
    play = np.floor(rng.beta(0.72, 1.5, n) * 1.42 * duration).astype(np.int64)
    long_view = play >= np.minimum(duration, 18_000)
    flags = _actions(rng, long_view)
    times = _times(rng, counts, play, period)
    local_s = times // 1000 + 8 * 3600
    day = local_s // 86_400 - (period.start_ms // 1000 + 8 * 3600) // 86_400
    clock = local_s % 86_400
    tab_p = _TAB_WEIGHTS / _TAB_WEIGHTS.sum()
    return {
        "user_id": np.repeat(user_ids, counts),
        "video_id": videos,
        "date": period.yyyymmdd()[np.clip(day, 0, period.days)],
        "hourmin": clock // 3600 * 100 + clock % 3600 // 60,
        "time_ms": times,
        **flags,
        "long_view": long_view.astype(np.int64),
        "play_time_ms": play,
        "duration_ms": duration,
        "profile_stay_time": np.where(
            flags["is_profile_enter"] == 1, 500 + rng.exponential(8_000, n).astype(np.int64), 0
        ),
        "comment_stay_time": np.where(
            (flags["is_comment"] == 1) | (rng.random(n) < 0.03),
            300 + rng.exponential(12_000, n).astype(np.int64),
            0,
        ),
        "is_rand": np.full(n, int(random_exposure), np.int64),
        "tab": rng.choice(len(tab_p), size=n, p=tab_p).astype(np.int64),
    }


def _popular_videos(rng: np.random.Generator, n: int, space: int) -> np.ndarray:
    """Video ids whose popularity rank follows a truncated power law (inverse CDF sampling)."""
    a = 1.0 - ZIPF_EXPONENT
    rank = np.floor(((space**a - 1.0) * rng.random(n) + 1.0) ** (1.0 / a)).astype(np.int64) - 1
    rank = np.minimum(rank, space - 1)
    # An affine bijection of [0, space) scatters popular ranks over the id space.
    mult = 2_654_435_761
    while math.gcd(mult, space) != 1:
        mult += 2
    return (rank * (mult % space) + 12_345) % space


def _duration_ms(videos: np.ndarray) -> np.ndarray:
    """A fixed duration per video id (a hash of it), exponential around ~25 s, 3 s .. 10 min."""
    z = videos.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    u = (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.minimum(3_000 + -np.log1p(-u) * 22_000, 600_000).astype(np.int64)


def _actions(rng: np.random.Generator, long_view: np.ndarray) -> dict[str, np.ndarray]:
    """The 0/1 flags other than long_view; clicks and likes lean on long views."""
    n = len(long_view)
    p_click = np.where(long_view, 0.60, 0.27)
    p_like = np.where(long_view, 0.06, 0.007)
    rates = {
        "is_click": p_click,
        "is_like": p_like,
        "is_follow": 0.002,
        "is_comment": 0.003,
        "is_forward": 0.002,
        "is_hate": 0.001,
        "is_profile_enter": 0.01,
    }
    return {name: (rng.random(n) < p).astype(np.int64) for name, p in rates.items()}


def _times(rng: np.random.Generator, counts: np.ndarray, play: np.ndarray, period: Period):
    """Epoch ms per event: plays back to back within sessions, breaks between sessions.

    Each user is active over a random stretch of the period; the breaks are stretched (or the
    whole history squeezed) so the user's events fill exactly that stretch.
    """
    n = len(play)
    segments = len(counts)
    starts = np.cumsum(counts) - counts
    seg = np.repeat(np.arange(segments), counts)
    step = np.empty(n)
    step[0] = 0.0
    step[1:] = play[:-1] + rng.exponential(1_500.0, n - 1)
    step[rng.random(n) < TIE_PROBABILITY] = 0.0
    is_break = rng.random(n) < 1.0 / SESSION_MEAN_EVENTS
    breaks = np.where(is_break, np.exp(rng.uniform(np.log(300_000), np.log(28_800_000), n)), 0.0)
    step = np.where(is_break, 0.0, step)
    step[starts] = 0.0
    breaks[starts] = 0.0
    active = rng.uniform(0.5, 1.0, segments) * period.length_ms
    offset = rng.uniform(0.0, 1.0, segments) * (period.length_ms - active)
    in_session = np.add.reduceat(step, starts)
    between = np.add.reduceat(breaks, starts)
    room = np.maximum(active - in_session, 0.0)
    stretch = np.where(between > 0, room / np.maximum(between, 1.0), 1.0)
    total = in_session + stretch * between
    squeeze = np.where(total > active, active / np.maximum(total, 1.0), 1.0)
    gap = (step + breaks * stretch[seg]) * squeeze[seg]
    elapsed = np.cumsum(gap)
    elapsed -= np.repeat(elapsed[starts], counts)
    return period.start_ms + np.floor(offset[seg] + elapsed).astype(np.int64)


def _open_log(path: Path):
    sink = open(path, "wb")
    sink.write((",".join(schema.LOG_COLUMNS) + "\n").encode())
    return sink


def _write_rows(sink, columns: dict[str, np.ndarray]) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if len(columns["user_id"]) == 0:
        return
    table = pa.table({name: columns[name] for name in schema.LOG_COLUMNS})
    pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False, quoting_style="none"))


def _write_user_features(path: Path, rng: np.random.Generator, ids: np.ndarray) -> None:
    """One row per user in user_id order; ranges derived from the counts, quoted when needed."""
    n = len(ids)
    cats = schema.CONTEXT_CATEGORIES
    degree = rng.choice(
        np.array(cats["user_active_degree"], dtype=object), size=n, p=[0.3, 0.5, 0.15, 0.05]
    )
    follow = np.where(rng.random(n) < 0.05, 0, rng.lognormal(np.log(60), 1.2, n)).astype(np.int64)
    fans = np.where(rng.random(n) < 0.1, 0, rng.lognormal(np.log(20), 2.0, n))
    fans = np.minimum(fans, 99_999).astype(np.int64)
    friends = np.where(rng.random(n) < 0.15, 0, rng.lognormal(np.log(10), 1.3, n)).astype(np.int64)
    register = (15 + np.exp(rng.uniform(0, np.log(2_500), n))).astype(np.int64)
    ranges = {
        "follow_user_num_range": np.searchsorted([0, 10, 50, 100, 150, 250, 500], follow),
        "fans_user_num_range": np.searchsorted([1, 10, 100, 1_000, 5_000, 10_000], fans, "right"),
        "friend_user_num_range": np.searchsorted([1, 5, 30, 60, 120, 250], friends, "right"),
        "register_days_range": np.searchsorted([30, 60, 90, 180, 365, 730], register),
    }
    onehot_sizes = (2, 7, 50, 1_500, 40, 8, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2)
    onehot = [rng.integers(0, k, n) for k in onehot_sizes]
    flags = [(rng.random(n) < p).astype(np.int64) for p in (0.05, 0.03, 0.3)]
    with open(path, "w", newline="") as f:
        out = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        out.writerow(schema.USER_FEATURE_COLUMNS)
        for i in range(n):
            out.writerow(
                [
                    int(ids[i]),
                    degree[i],
                    *(int(flag[i]) for flag in flags),
                    int(follow[i]),
                    cats["follow_user_num_range"][ranges["follow_user_num_range"][i]],
                    int(fans[i]),
                    cats["fans_user_num_range"][ranges["fans_user_num_range"][i]],
                    int(friends[i]),
                    cats["friend_user_num_range"][ranges["friend_user_num_range"][i]],
                    int(register[i]),
                    cats["register_days_range"][ranges["register_days_range"][i]],
                    *(int(col[i]) for col in onehot),
                ]
            )
