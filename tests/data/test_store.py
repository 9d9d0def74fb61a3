"""The sequence store: round trip, memory mapping, checksum and one-line errors on bad stores."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.data.store import (
    FORMAT_VERSION,
    DroppedUsers,
    SequenceStore,
    SourceFile,
    checksum,
    open_store,
    write_store,
)
from hstu_replay.errors import ConfigError, InputError

ARRAYS = dict(
    user_ids=np.array([3, 8, 20]),
    offsets=np.array([0, 2, 2, 5]),  # user 8 has an empty history
    video_ids=np.array([100, 101, 7, 8, 9]),
    actions=np.array([1, 65, 0, 255, 2], dtype=np.uint8),
    times_ms=np.array([10, 11, 5, 6, 6]),
    context=np.arange(15).reshape(3, 5) + 1,
)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    write_store(
        tmp_path / "store",
        **ARRAYS,
        sources=(SourceFile("a.csv", 12),),
        dropped=DroppedUsers(one_period_only=2, no_user_features=1),
    )
    return tmp_path / "store"


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_round_trip(store_dir):
    store = SequenceStore.open(store_dir)
    assert (len(store), store.num_users, store.num_events) == (3, 3, 5)
    assert store.user_ids.tolist() == [3, 8, 20]
    first = store.user(0)
    assert first.user_id == 3 and isinstance(first.user_id, int)
    assert first.context == (1, 2, 3, 4, 5)
    assert all(type(c) is int for c in first.context)
    assert first.video_ids.tolist() == [100, 101]
    assert first.actions.tolist() == [1, 65]
    assert first.times_ms.tolist() == [10, 11]
    assert len(store.user(1)) == 0
    assert store.user(-1).video_ids.tolist() == [7, 8, 9]
    assert [u.user_id for u in store] == [3, 8, 20]
    assert store.meta.dropped == DroppedUsers(2, 1)
    assert store.meta.sources == (SourceFile("a.csv", 12),)
    assert store.meta.format_version == FORMAT_VERSION


def test_index_of(store_dir):
    store = SequenceStore.open(store_dir)
    assert [store.index_of(u) for u in (3, 8, 20)] == [0, 1, 2]
    for missing in (0, 4, 21):
        with pytest.raises(KeyError):
            store.index_of(missing)
    with pytest.raises(IndexError):
        store.user(3)


def test_arrays_are_read_only_memory_maps_and_histories_are_views(store_dir):
    store = SequenceStore.open(store_dir)
    for array in (store.user_ids, store.offsets, store.video_ids, store.actions, store.times_ms):
        assert isinstance(array, np.memmap)
        assert not array.flags.writeable
    user = store.user(2)
    assert np.shares_memory(user.video_ids, store.video_ids)
    assert np.shares_memory(user.times_ms, store.times_ms)
    assert np.shares_memory(user.actions, store.actions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        user.user_id = 4  # type: ignore[misc]
    with pytest.raises(ValueError):
        user.video_ids[0] = 1


def test_open_is_fast_on_a_large_store(tmp_path):
    n = 3_000_000
    write_store(
        tmp_path / "big",
        user_ids=np.arange(1000),
        offsets=np.linspace(0, n, 1001).astype(np.int64),
        video_ids=np.zeros(n, np.int64),
        actions=np.zeros(n, np.uint8),
        times_ms=np.zeros(n, np.int64),
        context=np.ones((1000, 5), np.int64),
    )
    start = time.perf_counter()
    store = SequenceStore.open(tmp_path / "big")
    store.user(500)
    assert time.perf_counter() - start < 0.5


def test_verify_passes_then_catches_a_flipped_byte(store_dir):
    SequenceStore.open(store_dir).verify()
    path = store_dir / "video_ids.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the last video id
    path.write_bytes(bytes(data))
    store = SequenceStore.open(store_dir)  # shapes still fine
    with pytest.raises(InputError) as info:
        store.verify()
    assert "checksum mismatch" in one_line(info)


def test_checksum_covers_every_array_and_its_shape():
    base = checksum(ARRAYS)
    for name in ARRAYS:
        changed = dict(ARRAYS)
        changed[name] = ARRAYS[name].copy()
        changed[name].reshape(-1)[0] += 1
        assert checksum(changed) != base, name
    reshaped = dict(ARRAYS, context=ARRAYS["context"].reshape(5, 3))
    assert checksum(reshaped) != base


def test_writing_over_a_store_replaces_it(store_dir):
    write_store(store_dir, **dict(ARRAYS, video_ids=np.array([1, 2, 3, 4, 5])))
    store = SequenceStore.open(store_dir)
    assert store.video_ids.tolist() == [1, 2, 3, 4, 5]
    store.verify()


def test_writing_into_a_foreign_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as info:
        write_store(tmp_path, **ARRAYS)
    assert "not a sequence store" in one_line(info)


def test_write_store_rejects_inconsistent_arrays(tmp_path):
    with pytest.raises(ValueError, match="offsets"):
        write_store(tmp_path / "s", **dict(ARRAYS, offsets=np.array([0, 2, 1, 5])))
    with pytest.raises(ValueError, match="user_ids"):
        write_store(tmp_path / "s", **dict(ARRAYS, user_ids=np.array([3, 3, 20])))


# --- damaged stores: each a one-line InputError -----------------------------------------------


def test_a_store_named_by_an_option_fails_as_one_config_line_naming_it(tmp_path):
    write_store(tmp_path / "s", **ARRAYS)
    assert open_store(tmp_path / "s").meta.users == 3
    for path, flag, message in [(tmp_path / "nope", "--store", f"--store {tmp_path / 'nope'}: no such store directory"),
                                (tmp_path, "--data", f"--data {tmp_path}: not a sequence store (meta.json missing)"),
                                ("", "--store", "--store is required")]:
        with pytest.raises(ConfigError) as info:
            open_store(path, flag)
        assert one_line(info) == message and info.value.exit_code == 2


def test_missing_directory_and_meta(tmp_path):
    with pytest.raises(InputError) as info:
        SequenceStore.open(tmp_path / "nope")
    assert "no such store" in one_line(info)
    with pytest.raises(InputError) as info:
        SequenceStore.open(tmp_path)
    assert "meta.json missing" in one_line(info)


def test_unknown_format_version(store_dir):
    meta = json.loads((store_dir / "meta.json").read_text())
    meta["format_version"] = 99
    (store_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "format version 99" in one_line(info)


def test_garbled_meta(store_dir):
    (store_dir / "meta.json").write_text("{not json")
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "meta.json" in one_line(info)


def test_meta_missing_a_field(store_dir):
    meta = json.loads((store_dir / "meta.json").read_text())
    del meta["events"]
    (store_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "malformed meta" in one_line(info)


def test_missing_array(store_dir):
    (store_dir / "actions.npy").unlink()
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "actions.npy: missing" in one_line(info)


def test_truncated_array(store_dir):
    path = store_dir / "times_ms.npy"
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "times_ms.npy" in one_line(info)


def test_array_shape_disagrees_with_meta(store_dir):
    np.save(store_dir / "video_ids.npy", np.arange(4))
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "video_ids.npy has shape (4,), expected (5,)" in one_line(info)


def test_wrong_dtype(store_dir):
    np.save(store_dir / "actions.npy", np.zeros(5, np.int64))
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "actions.npy has dtype int64" in one_line(info)


def test_inconsistent_offsets(store_dir):
    np.save(store_dir / "offsets.npy", np.array([0, 3, 2, 5]))
    with pytest.raises(InputError) as info:
        SequenceStore.open(store_dir)
    assert "offsets" in one_line(info)
