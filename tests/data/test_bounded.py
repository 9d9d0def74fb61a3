"""`prepare_bounded`: the in-memory path's store byte for byte, any release's layout, bad input
and a full disk as one line with nothing half-written left behind."""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from hstu_replay import cli
from hstu_replay.data import schema
from hstu_replay.data.bounded import prepare_bounded
from hstu_replay.data.limits import BASE_BYTES, MIN_GROUP_EVENTS, SORT_BYTES_PER_EVENT
from hstu_replay.data.prepare import prepare
from hstu_replay.data.store import ARRAYS, META_FILE, SequenceStore
from hstu_replay.data.synth import synthesize
from hstu_replay.errors import ConfigError, OutputError

from .conftest import DEFAULT_FEATURES, features_text, log_line, log_text

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "sample"
#: The smallest limit: groups of MIN_GROUP_EVENTS events, so a few thousand events make many groups.
TIGHT_GB = (BASE_BYTES + SORT_BYTES_PER_EVENT * MIN_GROUP_EVENTS) / 1e9


def assert_same_store(a: Path, b: Path, ignore: tuple[str, ...] = ("created",)) -> None:
    """Every array file identical byte for byte; meta.json equal but for `ignore`d keys."""
    for name in ARRAYS:
        assert filecmp.cmp(a / f"{name}.npy", b / f"{name}.npy", shallow=False), name
    meta_a, meta_b = (json.loads((d / META_FILE).read_text()) for d in (a, b))
    for key in ignore:
        meta_a.pop(key), meta_b.pop(key)
    assert meta_a == meta_b


def leftovers(out: Path) -> list[str]:
    """Anything a failed run left beside (or as) the store directory."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith((out.name, f".{out.name}")))


# --- the same store as the in-memory path ----------------------------------------------------


@pytest.mark.parametrize("include_random", [False, True])
def test_many_groups_give_the_in_memory_store_byte_for_byte(tmp_path, include_random):
    raw = tmp_path / "raw"
    synthesize(raw, users=60, seed=4, events_per_user_scale=0.3)
    prepare(raw, tmp_path / "memory", include_random=include_random)
    meta = prepare_bounded(raw, tmp_path / "bounded", include_random=include_random, memory_gb=TIGHT_GB)
    assert meta.events > 2 * MIN_GROUP_EVENTS  # three sorting groups or more
    assert_same_store(tmp_path / "memory", tmp_path / "bounded")


def test_blocks_held_in_memory_then_spilled_give_the_same_store(tmp_path, monkeypatch):
    """Small CSV blocks: the first few fit a sorting group and wait in memory, then one passes it
    and every record so far goes to the spill files, the held blocks first."""
    from hstu_replay.data import bounded

    monkeypatch.setattr(bounded, "BLOCK_BYTES", 1 << 20)  # about 14k rows a block, under a group's 65,536
    raw = tmp_path / "raw"
    synthesize(raw, users=60, seed=4, events_per_user_scale=0.3)
    prepare(raw, tmp_path / "memory")
    meta = prepare_bounded(raw, tmp_path / "bounded", memory_gb=TIGHT_GB)
    assert meta.events > 2 * MIN_GROUP_EVENTS
    assert_same_store(tmp_path / "memory", tmp_path / "bounded")


def test_a_log_out_of_user_order_spills_the_same_store(tmp_path):
    """Rows shuffled (a log not in user order): each block's records are reordered by user range
    before they reach the spill files; the store is still the in-memory path's."""
    raw = tmp_path / "raw"
    synthesize(raw, users=60, seed=4, events_per_user_scale=0.3)
    rng = np.random.default_rng(0)
    for name in schema.STANDARD_LOGS:
        header, *rows = (raw / name).read_bytes().splitlines(keepends=True)
        (raw / name).write_bytes(header + b"".join(rows[i] for i in rng.permutation(len(rows))))
    prepare(raw, tmp_path / "memory")
    meta = prepare_bounded(raw, tmp_path / "bounded", memory_gb=TIGHT_GB)
    assert meta.events > 2 * MIN_GROUP_EVENTS
    assert_same_store(tmp_path / "memory", tmp_path / "bounded")


def test_sample_dataset_byte_for_byte(tmp_path):
    prepare(SAMPLE, tmp_path / "memory")
    prepare_bounded(SAMPLE, tmp_path / "bounded")
    assert_same_store(tmp_path / "memory", tmp_path / "bounded")


def test_ties_unfeatured_and_one_period_users_byte_for_byte(write_raw, tmp_path):
    raw = write_raw(
        period1=[log_line(9, 1, 700), log_line(1, 10, 700), log_line(1, 11, 300), log_line(7, 5, 1),
                 log_line(3, 4, 9)],
        period2=[log_line(1, 20, 700), log_line(9, 2, 5), log_line(7, 6, 2), log_line(1, 21, 100),
                 log_line(2, 8, 8)],
        random=[log_line(1, 30, 700), log_line(2, 31, 1)],
    )  # 9: no features; 7: no features; 3 and 2: one period only
    for include_random in (False, True):
        tag = f"r{int(include_random)}"
        prepare(raw, tmp_path / f"memory-{tag}", include_random=include_random)
        prepare_bounded(raw, tmp_path / f"bounded-{tag}", include_random=include_random)
        assert_same_store(tmp_path / f"memory-{tag}", tmp_path / f"bounded-{tag}")


def test_large_ids_and_wide_times_take_the_general_paths(write_raw, tmp_path):
    big = 1 << 40
    features = [(big + i, *row[1:]) for i, row in enumerate(DEFAULT_FEATURES)]
    raw = write_raw(
        period1=[log_line(big + 1, 1, -(1 << 61)), log_line(big, 2, 5), log_line(big + 1, 3, 1 << 61)],
        period2=[log_line(big, 4, 4), log_line(big + 1, 5, 0)],
        features=features,
    )
    prepare(raw, tmp_path / "memory")
    prepare_bounded(raw, tmp_path / "bounded")
    assert_same_store(tmp_path / "memory", tmp_path / "bounded")


# --- releases and part files ---------------------------------------------------------------


def concatenated_as_1k(raw: Path, release: schema.Release, out: Path) -> Path:
    """The release's part files joined (header once) under the 1K names: the in-memory oracle's input."""
    out.mkdir()
    for period, name in enumerate((schema.LOG_PERIOD1, schema.LOG_PERIOD2)):
        with open(out / name, "wb") as sink:
            for k, part in enumerate(release.period_files(raw, period)):
                lines = part.read_bytes().splitlines(keepends=True)
                sink.writelines(lines if k == 0 else lines[1:])
    shutil.copy(raw / release.random_log, out / schema.LOG_RANDOM)
    shutil.copy(raw / release.user_features, out / schema.USER_FEATURES)
    return out


def test_27k_part_files_are_the_concatenated_logs(tmp_path):
    release = schema.RELEASES["27k"]
    raw = tmp_path / "raw"
    report = synthesize(raw, users=40, seed=2, events_per_user_scale=0.2, release="27k")
    assert sorted(report.file_sizes) == sorted(
        [release.part_name(p, k) for p in (0, 1) for k in range(release.parts)]
        + [release.random_log, release.user_features]
    )
    assert min(report.file_sizes.values()) > 1000  # every part holds rows
    prepare(concatenated_as_1k(raw, release, tmp_path / "joined"), tmp_path / "memory", include_random=True)
    meta = prepare_bounded(raw, tmp_path / "bounded", include_random=True, memory_gb=TIGHT_GB)
    assert [s.name for s in meta.sources] == [p.name for p in release.period_files(raw, 0)] + [
        p.name for p in release.period_files(raw, 1)] + [release.random_log, release.user_features]
    assert_same_store(tmp_path / "memory", tmp_path / "bounded", ignore=("created", "sources"))


def write_release(raw: Path, release: schema.Release, periods: list[list[list[str]]]) -> Path:
    """Hand-written files under a release's real names: `periods[p][k]` the rows of part k."""
    raw.mkdir()
    for p, parts in enumerate(periods):
        for k, rows in enumerate(parts):
            (raw / release.part_name(p, k)).write_text(log_text(rows))
    (raw / release.random_log).write_text(log_text([]))
    (raw / release.user_features).write_text(features_text(DEFAULT_FEATURES))
    return raw


@pytest.mark.parametrize("name", ["27k", "pure"])
def test_real_file_names_of_each_release(tmp_path, name):
    release = schema.RELEASES[name]
    parts = max(1, release.parts)
    split = lambda rows: [rows[k::parts] for k in range(parts)]  # noqa: E731
    raw = write_release(tmp_path / "raw", release, [
        split([log_line(1, 10, 5), log_line(2, 11, 6), log_line(1, 12, 1), log_line(3, 13, 2)]),
        split([log_line(1, 20, 3), log_line(2, 21, 9), log_line(4, 22, 1), log_line(1, 23, 7)]),
    ])
    prepare_bounded(raw, tmp_path / "store")
    store = SequenceStore.open(tmp_path / "store")
    assert store.user_ids.tolist() == [1, 2]
    assert store.user(0).video_ids.tolist() == [12, 20, 10, 23]  # parts joined, then time-sorted
    assert store.user(1).video_ids.tolist() == [11, 21]
    assert store.meta.dropped.one_period_only == 2


def test_more_parts_than_published_are_read_in_number_order(tmp_path):
    release = schema.RELEASES["27k"]
    raw = write_release(tmp_path / "raw", release, [
        [[log_line(1, 10, 5)], [log_line(1, 11, 5)], [log_line(1, 12, 5)]],
        [[log_line(1, 20, 5)], [log_line(1, 21, 5)]],
    ])
    prepare_bounded(raw, tmp_path / "store")
    assert SequenceStore.open(tmp_path / "store").user(0).video_ids.tolist() == [10, 11, 12, 20, 21]


# --- bad input: one line naming the file, exit 2, nothing left -----------------------------


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def assert_refused(capsys, raw: Path, out: Path, *fragments: str) -> None:
    code, err = run_cli(capsys, "data", "prepare", str(raw), "--out", str(out))
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err
    assert leftovers(out) == []


@pytest.fixture
def raw27k(tmp_path) -> Path:
    synthesize(tmp_path / "raw", users=20, seed=6, events_per_user_scale=0.05, release="27k")
    return tmp_path / "raw"


def test_missing_part_file(raw27k, tmp_path, capsys):
    missing = schema.RELEASES["27k"].part_name(1, 1)
    (raw27k / missing).unlink()
    assert_refused(capsys, raw27k, tmp_path / "store", missing, "file not found")


def test_gap_in_the_part_numbers(raw27k, tmp_path, capsys):
    release = schema.RELEASES["27k"]
    third = raw27k / f"{release.periods[0]}_part3.csv"
    shutil.copy(raw27k / release.part_name(0, 0), third)
    (raw27k / release.part_name(0, 1)).unlink()
    assert_refused(capsys, raw27k, tmp_path / "store", release.part_name(0, 1), "file not found")


def test_truncated_part_file(raw27k, tmp_path, capsys):
    part = raw27k / schema.RELEASES["27k"].part_name(0, 1)
    data = part.read_bytes()
    part.write_bytes(data[: len(data) - 7])
    assert_refused(capsys, raw27k, tmp_path / "store", part.name, "no final newline: truncated file?")


def test_part_file_in_another_column_order(raw27k, tmp_path, capsys):
    part = raw27k / schema.RELEASES["27k"].part_name(1, 0)
    lines = part.read_text().splitlines()
    swapped = [",".join([f[1], f[0], *f[2:]]) for f in (line.split(",") for line in lines)]
    part.write_text("\n".join(swapped) + "\n")
    assert_refused(capsys, raw27k, tmp_path / "store", part.name, "columns in another order",
                   "column 1 is 'video_id'")


def test_bad_row_in_the_middle_of_a_part_names_its_line(raw27k, tmp_path, capsys):
    part = raw27k / schema.RELEASES["27k"].part_name(0, 0)
    lines = part.read_text().splitlines()
    lines[40] = lines[40].replace(",", ",x", 1)
    part.write_text("\n".join(lines) + "\n")
    assert_refused(capsys, raw27k, tmp_path / "store", part.name, "line 41, column 2 (video_id)",
                   "invalid value 'x")


def test_two_releases_in_one_folder(raw27k, tmp_path, capsys):
    (raw27k / schema.USER_FEATURES).write_text(features_text(DEFAULT_FEATURES))
    assert_refused(capsys, raw27k, tmp_path / "store", "more than one of")


def test_failure_keeps_the_previous_store(raw27k, tmp_path, capsys):
    out = tmp_path / "store"
    prepare_bounded(raw27k, out)
    before = (out / "video_ids.npy").read_bytes()
    (raw27k / schema.RELEASES["27k"].part_name(0, 1)).write_text("user_id\n")
    code, err = run_cli(capsys, "data", "prepare", str(raw27k), "--out", str(out))
    assert code == 2 and "header lacks column(s) video_id" in err
    SequenceStore.open(out).verify()
    assert (out / "video_ids.npy").read_bytes() == before


def test_memory_limit_too_small_is_refused(raw27k, tmp_path):
    with pytest.raises(ConfigError, match="--memory-gb 0.1: too little"):
        prepare_bounded(raw27k, tmp_path / "store", memory_gb=0.1)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KB tmpfs mounted for the test (root only; skipped elsewhere)."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    tried = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                           capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {tried.stderr.strip()[:80]}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_disk_that_fills_leaves_no_store(small_disk, tmp_path, capsys):
    raw = tmp_path / "raw"
    synthesize(raw, users=30, seed=1, events_per_user_scale=0.05)  # ~17k events: ~0.7 MB of store
    out = small_disk / "store"
    with pytest.raises(OutputError, match="no space left on device while writing the store"):
        prepare_bounded(raw, out)
    assert list(small_disk.iterdir()) == []
    assert_refused(capsys, raw, out, str(small_disk), "no space left on device")


def test_header_only_part_is_empty_not_an_error(tmp_path):
    release = schema.RELEASES["27k"]
    raw = write_release(tmp_path / "raw", release, [
        [[log_line(1, 10, 5)], []],
        [[], [log_line(1, 20, 6)]],
    ])
    prepare_bounded(raw, tmp_path / "store")
    assert SequenceStore.open(tmp_path / "store").video_ids.tolist() == [10, 20]
    assert np.array_equal(SequenceStore.open(tmp_path / "store").offsets, [0, 2])

