"""What `hstu-replay data inspect` shows: a human summary and a per-user JSON digest.

Both stream over the memory maps (bincount by chunk, reduceat per user) and never hold a copy
of an event array.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hstu_replay.data.store import DroppedUsers, SequenceStore, SourceFile
from hstu_replay.interface import ACTION_BITS

_CHUNK = 1 << 22


@dataclass(frozen=True)
class LengthStats:
    min: int
    p50: int
    p90: int
    max: int


@dataclass(frozen=True)
class StoreSummary:
    path: str
    users: int
    events: int
    bytes: int  # the arrays' files on disk
    lengths: LengthStats
    action_rates: tuple[tuple[str, float], ...]  # share of events with each bit set
    dropped: DroppedUsers
    include_random: bool
    sources: tuple[SourceFile, ...]


def summarize(store: SequenceStore) -> StoreSummary:
    lengths = np.diff(np.asarray(store.offsets))
    if lengths.size:
        p50, p90 = np.percentile(lengths, [50, 90], method="nearest")
        stats = LengthStats(int(lengths.min()), int(p50), int(p90), int(lengths.max()))
    else:
        stats = LengthStats(0, 0, 0, 0)
    histogram = np.zeros(256, np.int64)
    actions = store.actions
    for start in range(0, len(actions), _CHUNK):
        histogram += np.bincount(actions[start : start + _CHUNK], minlength=256)
    values = np.arange(256)
    total = max(1, store.num_events)
    rates = tuple(
        (name, float(histogram[(values & weight) != 0].sum() / total))
        for name, weight in ACTION_BITS
    )
    return StoreSummary(
        path=str(store.path),
        users=store.num_users,
        events=store.num_events,
        bytes=store.nbytes,
        lengths=stats,
        action_rates=rates,
        dropped=store.meta.dropped,
        include_random=store.meta.include_random,
        sources=store.meta.sources,
    )


def format_summary(s: StoreSummary) -> str:
    lines = [
        f"store     {s.path}",
        f"users     {s.users:,} (dropped: {s.dropped.one_period_only:,} in one period only, "
        f"{s.dropped.no_user_features:,} without user features)",
        f"events    {s.events:,}" + (" (standard + random logs)" if s.include_random else ""),
        f"size      {s.bytes / 1e6:,.1f} MB of arrays ({s.bytes:,} bytes, memory-mapped when read)",
        f"history   min {s.lengths.min:,}  p50 {s.lengths.p50:,}  p90 {s.lengths.p90:,}  "
        f"max {s.lengths.max:,}",
        "actions   " + "  ".join(f"{name} {rate:.4f}" for name, rate in s.action_rates),
    ]
    lines += [f"source    {f.name} ({f.size:,} bytes)" for f in s.sources]
    return "\n".join(lines)


def per_user_digest(store: SequenceStore) -> dict:
    """{"users", "events", "per_user": [...]}: sums and ends of each sequence, as Python ints.

    Small enough to diff two stores (or a store and another implementation) user by user.
    """
    offsets = np.asarray(store.offsets)
    starts, lengths = offsets[:-1], np.diff(offsets)
    filled = lengths > 0
    video_sums = np.zeros(len(lengths), np.int64)
    action_sums = np.zeros(len(lengths), np.int64)
    if filled.any():
        video_sums[filled] = np.add.reduceat(store.video_ids, starts[filled], dtype=np.int64)
        action_sums[filled] = np.add.reduceat(store.actions, starts[filled], dtype=np.int64)
    videos = store.video_ids
    per_user = []
    for i, (user_id, context) in enumerate(zip(store.user_ids.tolist(), store.context.tolist())):
        n = int(lengths[i])
        per_user.append(
            {
                "user_id": user_id,
                "events": n,
                "context": context,
                "video_ids_sum": int(video_sums[i]),
                "actions_sum": int(action_sums[i]),
                "first_video_id": int(videos[starts[i]]) if n else None,
                "last_video_id": int(videos[starts[i] + n - 1]) if n else None,
            }
        )
    return {"users": store.num_users, "events": store.num_events, "per_user": per_user}
