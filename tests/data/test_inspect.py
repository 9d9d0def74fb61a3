"""`summary`: the numbers `hstu-replay data inspect` shows."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.data.store import DroppedUsers, SequenceStore, SourceFile, write_store
from hstu_replay.data.inspect import format_summary, per_user_digest, summarize


@pytest.fixture
def store(tmp_path) -> SequenceStore:
    write_store(
        tmp_path / "s",
        user_ids=np.array([5, 9, 12]),
        offsets=np.array([0, 1, 1, 5]),
        video_ids=np.array([40, 7, 8, 9, 2**40]),
        actions=np.array([65, 1, 0, 255, 128], dtype=np.uint8),
        times_ms=np.array([1, 2, 3, 4, 5]),
        context=np.array([[1, 1, 1, 1, 1], [2, 1, 3, 1, 2], [1, 2, 1, 2, 1]]),
        sources=(SourceFile("log_a.csv", 1234),),
        dropped=DroppedUsers(one_period_only=3),
    )
    return SequenceStore.open(tmp_path / "s")


def test_summary_numbers(store):
    s = summarize(store)
    assert (s.users, s.events) == (3, 5)
    assert s.bytes == sum(f.stat().st_size for f in store.path.glob("*.npy"))
    assert s.bytes == 6 * 128 + 8 * (3 + 4 + 5 + 5 + 15) + 5  # six 128-byte npy headers + the data
    assert (s.lengths.min, s.lengths.p50, s.lengths.max) == (0, 1, 4)
    rates = dict(s.action_rates)
    assert list(rates) == [
        "is_click", "is_like", "is_follow", "is_comment", "is_forward", "is_hate", "long_view",
        "is_profile_enter",
    ]
    assert rates["is_click"] == pytest.approx(3 / 5)  # 65, 1, 255
    assert rates["long_view"] == pytest.approx(2 / 5)  # 65, 255
    assert rates["is_profile_enter"] == pytest.approx(2 / 5)  # 255, 128
    assert rates["is_like"] == pytest.approx(1 / 5)
    text = format_summary(s)
    assert "users     3 (dropped: 3 in one period only" in text
    assert "min 0  p50 1  p90 4  max 4" in text
    assert "log_a.csv (1,234 bytes)" in text
    assert f"size      0.0 MB of arrays ({s.bytes:,} bytes" in text


def test_per_user_digest(store):
    digest = per_user_digest(store)
    assert digest["users"] == 3 and digest["events"] == 5
    assert digest["per_user"][0] == {
        "user_id": 5, "events": 1, "context": [1, 1, 1, 1, 1], "video_ids_sum": 40,
        "actions_sum": 65, "first_video_id": 40, "last_video_id": 40,
    }
    assert digest["per_user"][1]["events"] == 0
    assert digest["per_user"][1]["first_video_id"] is None
    last = digest["per_user"][2]
    assert last["video_ids_sum"] == 7 + 8 + 9 + 2**40
    assert last["actions_sum"] == 1 + 0 + 255 + 128
    assert (last["first_video_id"], last["last_video_id"]) == (7, 2**40)
    for row in digest["per_user"]:
        assert all(type(v) is int for k, v in row.items() if k != "context" and v is not None)
        assert all(type(c) is int for c in row["context"])
