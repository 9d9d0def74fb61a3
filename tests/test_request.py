import numpy as np
import pytest

from hstu_replay.errors import InputError, LimitError
from hstu_replay.interface import INTERFACES, KVCACHE, NOCACHE, PYTHON_BACKEND, Limits
from hstu_replay.request import RequestTensors, UserRequest, build_request


def user(uid, hist, cand, key=None, ctx=(1, 2, 3, 4, 5)):
    items = np.arange(100 * uid, 100 * uid + hist, dtype=np.int64)
    actions = (items % 256).astype(np.int64)
    cands = np.arange(9000 + uid * 10, 9000 + uid * 10 + cand, dtype=np.int64)
    return UserRequest(uid, ctx, items, actions, cands, key)


def test_layout_matches_the_published_example():
    u0 = user(1, 2, 1, ctx=(11, 12, 13, 14, 15))
    u1 = user(2, 1, 2, ctx=(21, 22, 23, 24, 25))
    r = build_request([u0, u1])
    assert r.lengths.tolist() == [1, 1] * 6 + [3, 3, 3, 3]
    assert r.values.tolist() == [
        1, 2, 11, 21, 12, 22, 13, 23, 14, 24, 15, 25,
        100, 101, 9010,  # user 1 items: history then candidates
        200, 9020, 9021,  # user 2
        100, 101, 0,  # user 1 actions, 0 for the candidate
        200, 0, 0,
    ]
    assert r.num_candidates.tolist() == [1, 2]
    assert r.user_ids.tolist() == [1, 2]
    assert r.total_history_lengths.tolist() == [6 + 4, 6 + 2]
    assert r.values.dtype == np.int64 and r.lengths.dtype == np.int64


def test_cache_key_is_separate_from_the_embedded_user_id():
    r = build_request([user(3, 4, 2, key=777)])
    assert r.user_ids.tolist() == [777]
    assert r.values[0] == 3


@pytest.mark.parametrize("interface", list(INTERFACES.values()), ids=list(INTERFACES))
def test_round_trip_through_each_interface(interface):
    users = [user(1, 5, 3), user(2, 0, 4, key=99), user(3, 7, 1)]
    r = build_request(users)
    inputs = r.inputs(interface)
    assert set(inputs) == set(interface.input_names)
    back = RequestTensors.from_inputs(inputs, interface)
    for a, b in zip(users, back.users()):
        assert a.user_id == b.user_id and a.context == b.context
        assert np.array_equal(a.history_items, b.history_items)
        assert np.array_equal(a.history_actions, b.history_actions)
        assert np.array_equal(a.candidates, b.candidates)
    if interface.uses_cache:
        assert [u.key for u in back.users()] == [1, 99, 3]


def test_interface_input_counts():
    assert len(KVCACHE.inputs) == 5 and len(NOCACHE.inputs) == 3 and len(PYTHON_BACKEND.inputs) == 4
    assert KVCACHE.outputs[0].dims == (-1, 8) and KVCACHE.outputs[1].dtype == "INT64"


@pytest.mark.parametrize(
    "users, limits, message",
    [
        ([], Limits(), "batch of 0"),
        ([user(i, 1, 1) for i in range(9)], Limits(), "batch of 9"),
        ([user(1, 4097, 1)], Limits(max_values=10**6), "exceeds 4096"),
        ([user(1, 3, 101)], Limits(), "101 candidates"),
        ([user(1, 3, 1), user(2, 3, 1, key=1)], Limits(), "appears twice"),
        ([user(i, 2500, 100) for i in range(8)], Limits(), "at most 40000"),
    ],
)
def test_limits_refuse_before_sending(users, limits, message):
    with pytest.raises(LimitError, match=message):
        build_request(users, limits)


def test_limits_are_configurable():
    big = [user(i, 4096, 100) for i in range(8)]
    r = build_request(big, Limits(max_values=70_000))
    assert len(r.values) == 67_184  # the full-length batch of 8


def test_mismatched_actions_refused():
    u = user(1, 3, 1)
    bad = UserRequest(u.user_id, u.context, u.history_items, u.history_actions[:2], u.candidates)
    with pytest.raises(LimitError, match="3 history items but 2 actions"):
        build_request([bad])


def test_inverse_rejects_malformed_tensors():
    r = build_request([user(1, 3, 2), user(2, 2, 1)])
    broken = dict(r.inputs(KVCACHE))
    broken["INPUT__0"] = broken["INPUT__0"][:-1]
    with pytest.raises(InputError, match="lengths sum"):
        RequestTensors.from_inputs(broken, KVCACHE)
    wrong_thl = dict(r.inputs(KVCACHE), INPUT__4=np.array([1, 2], dtype=np.int64))
    with pytest.raises(InputError, match="total_history_lengths"):
        RequestTensors.from_inputs(wrong_thl, KVCACHE)
    floats = dict(r.inputs(NOCACHE), INPUT__1=r.lengths.astype(np.float32))
    with pytest.raises(InputError, match="int64"):
        RequestTensors.from_inputs(floats, NOCACHE)
    with pytest.raises(InputError, match="lacks"):
        RequestTensors.from_inputs({"INPUT__0": r.values}, NOCACHE)
