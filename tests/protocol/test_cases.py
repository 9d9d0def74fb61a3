"""Cases: users laid out into logical batches before any timing, each user on a fresh key."""

import numpy as np
import pytest

from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.protocol.cases import KEY_BASE, ProtocolUser, make_cases, users_from_store
from hstu_replay.request import UserRequest


def _user(uid: int, history: int, candidates: int = 2) -> ProtocolUser:
    items = np.arange(history + candidates, dtype=np.int64) + 100 * uid
    return ProtocolUser(UserRequest(uid, (1, 1, 1, 1, 1), items[:history], np.ones(history, np.int64),
                                    items[history:]), np.full((candidates, 8), uid, np.float32))


def test_cases_take_each_user_once_in_order_on_fresh_keys():
    users = [_user(u, 3 + u) for u in range(7)]
    cases = make_cases(users, 3, None, Limits(), nonce=5)
    assert len(cases) == 2  # 7 users make two cases of 3; the seventh is left out
    ids = [c.tensors.values[:3].tolist() for c in cases]  # user_id is the first feature
    assert ids == [[0, 1, 2], [3, 4, 5]]
    keys = np.concatenate([c.tensors.user_ids for c in cases])
    assert keys.tolist() == [KEY_BASE + (5 << 24) + i for i in range(6)]
    assert cases[1].reference[:, 0].tolist() == [3, 3, 4, 4, 5, 5]  # each user's own reference rows
    assert cases[0].tensors.total_history_lengths.tolist() == [6 + 2 * 3, 6 + 2 * 4, 6 + 2 * 5]


def test_two_runs_never_share_a_key():
    users = [_user(u, 4) for u in range(8)]
    a = {int(k) for c in make_cases(users, 2, None, Limits(), nonce=1) for k in c.tensors.user_ids}
    b = {int(k) for c in make_cases(users, 2, None, Limits(), nonce=2) for k in c.tensors.user_ids}
    assert len(a) == 8 and not a & b


def test_too_few_users_or_cases_is_one_line():
    users = [_user(u, 4) for u in range(5)]
    with pytest.raises(ConfigError, match="batch size 4: 5 users make 1 cases; the protocol needs 2"):
        make_cases(users, 4, None, Limits())
    with pytest.raises(ConfigError, match="make 2 cases; the protocol needs 3"):
        make_cases(users, 2, 3, Limits())
    with pytest.raises(ConfigError, match="--cases 1"):
        make_cases(users, 2, 1, Limits())


def test_limits_are_checked_before_anything_is_sent():
    from hstu_replay.errors import LimitError

    with pytest.raises(LimitError, match="values"):
        make_cases([_user(u, 50) for u in range(4)], 2, None, Limits(max_values=100))


def test_store_users_rank_their_latest_events(tmp_path):
    from hstu_replay.data.prepare import prepare
    from hstu_replay.data.store import SequenceStore
    from hstu_replay.data.synth import synthesize

    synthesize(tmp_path / "raw", users=6, seed=3, events_per_user_scale=0.02)
    prepare(tmp_path / "raw", tmp_path / "store")
    store = SequenceStore.open(tmp_path / "store")
    users = users_from_store(str(tmp_path / "store"), candidates=4, max_history=10)
    assert users and all(u.reference is None for u in users)
    for u in users:
        history = store.user(store.index_of(u.request.user_id))
        assert u.request.candidates.tolist() == history.video_ids[-4:].tolist()
        start = max(0, len(history.video_ids) - 14)
        assert u.request.history_items.tolist() == history.video_ids[start:-4].tolist()
        assert u.request.history_actions.tolist() == history.actions[start:-4].tolist()
    assert any(u.request.history_length == 10 for u in users)  # the cap was reached somewhere
