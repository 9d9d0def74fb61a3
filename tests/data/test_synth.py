"""The synthesizer: the published schema and quoting, determinism, and a plausible shape."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from hstu_replay.data import schema
from hstu_replay.data.synth import synthesize

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "sample"
UTC8 = dt.timezone(dt.timedelta(hours=8))


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    synthesize(out, users=60, seed=3, events_per_user_scale=0.04)
    return out


def read_log(path: Path) -> dict[str, np.ndarray]:
    types = {name: pa.int64() for name in schema.LOG_COLUMNS}
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=types))
    return {name: table.column(name).to_numpy() for name in schema.LOG_COLUMNS}


def digest(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in schema.RAW_FILES}


def test_writes_the_four_files_with_the_published_headers(raw):
    assert sorted(p.name for p in raw.iterdir()) == sorted(schema.RAW_FILES)
    for name in (schema.LOG_PERIOD1, schema.LOG_PERIOD2, schema.LOG_RANDOM):
        first = (raw / name).open().readline()
        assert first == ",".join(schema.LOG_COLUMNS) + "\n"
    first = (raw / schema.USER_FEATURES).open().readline()
    assert first == ",".join(schema.USER_FEATURE_COLUMNS) + "\n"
    assert len(schema.USER_FEATURE_COLUMNS) == 31


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    synthesize(tmp_path / "a", users=12, seed=5, events_per_user_scale=0.01)
    synthesize(tmp_path / "b", users=12, seed=5, events_per_user_scale=0.01)
    synthesize(tmp_path / "c", users=12, seed=6, events_per_user_scale=0.01)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    other = digest(tmp_path / "c")
    assert all(other[n] != h for n, h in digest(tmp_path / "a").items())


def test_the_shipped_sample_is_what_its_documented_command_writes(tmp_path):
    # datasets/README.md:
    #   hstu-replay data synth --out datasets/sample --users 24 --seed 7 --scale 0.01
    synthesize(tmp_path, users=24, seed=7, events_per_user_scale=0.01)
    assert digest(tmp_path) == digest(SAMPLE)
    assert sum((SAMPLE / n).stat().st_size for n in schema.RAW_FILES) < 500_000


def test_user_features_quote_exactly_the_fields_with_commas(raw):
    text = (raw / schema.USER_FEATURES).read_text()
    for line in text.splitlines()[1:]:
        quoted = re.findall(r'"([^"]*)"', line)
        assert all("," in q for q in quoted)
        unquoted = re.sub(r'"[^"]*"', "Q", line)
        assert '"' not in unquoted
    with open(raw / schema.USER_FEATURES, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 60
    for row in rows:
        assert len(row) == 31 and None not in row
        for column, categories in schema.CONTEXT_CATEGORIES.items():
            assert row[column] in categories
        follow = int(row["follow_user_num"])
        assert (row["follow_user_num_range"] == "0") == (follow == 0)
        if row["follow_user_num_range"] == "(0,10]":
            assert 1 <= follow <= 10
        fans = int(row["fans_user_num"])
        if row["fans_user_num_range"] == "[10,100)":
            assert 10 <= fans < 100
        days = int(row["register_days"])
        assert (row["register_days_range"] == "730+") == (days > 730)
        assert all(row[f"onehot_feat{i}"].isdigit() for i in range(18))
    ids = [int(r["user_id"]) for r in rows]
    assert ids == sorted(ids)


@pytest.mark.parametrize(
    "name, first_day, last_day, is_rand",
    [
        (schema.LOG_PERIOD1, dt.date(2022, 4, 8), dt.date(2022, 4, 21), 0),
        (schema.LOG_PERIOD2, dt.date(2022, 4, 22), dt.date(2022, 5, 8), 0),
        (schema.LOG_RANDOM, dt.date(2022, 4, 22), dt.date(2022, 5, 8), 1),
    ],
)
def test_log_fields_are_consistent(raw, name, first_day, last_day, is_rand):
    log = read_log(raw / name)
    n = len(log["user_id"])
    assert n > 0
    assert (log["is_rand"] == is_rand).all()
    assert log["tab"].min() >= 0 and log["tab"].max() <= 14
    for flag in (*schema.ACTION_COLUMNS,):
        assert set(np.unique(log[flag]).tolist()) <= {0, 1}
    assert (log["duration_ms"] > 0).all() and (log["play_time_ms"] >= 0).all()
    for i in np.linspace(0, n - 1, 50).astype(int):
        when = dt.datetime.fromtimestamp(log["time_ms"][i] / 1000, UTC8)
        assert first_day <= when.date() <= last_day
        assert log["date"][i] == int(when.strftime("%Y%m%d"))
        assert log["hourmin"][i] == when.hour * 100 + when.minute
    users = log["user_id"]
    changes = np.flatnonzero(np.diff(users)) + 1
    assert len(np.unique(users)) == len(changes) + 1  # each user's rows are contiguous
    same_user = np.diff(users) == 0
    assert (np.diff(log["time_ms"])[same_user] >= 0).all()  # in time order within a user


def test_a_few_users_log_in_one_period_only(raw):
    p1 = set(read_log(raw / schema.LOG_PERIOD1)["user_id"].tolist())
    p2 = set(read_log(raw / schema.LOG_PERIOD2)["user_id"].tolist())
    rnd = set(read_log(raw / schema.LOG_RANDOM)["user_id"].tolist())
    assert p1 - p2 and p2 - p1
    assert len(p1 | p2) == 60
    assert rnd <= p2


def test_shape_is_plausible(raw):
    logs = [read_log(raw / n) for n in schema.STANDARD_LOGS]
    log = {k: np.concatenate([x[k] for x in logs]) for k in schema.LOG_COLUMNS}
    n = len(log["user_id"])
    assert abs(n - 60 * 11_713 * 0.04) < 0.05 * n
    rates = {f: log[f].mean() for f in (*schema.ACTION_COLUMNS,)}
    assert 0.3 <= rates["is_click"] <= 0.4
    assert 0.2 <= rates["long_view"] <= 0.3
    assert 0.01 <= rates["is_like"] <= 0.03
    assert 0.004 <= rates["is_profile_enter"] <= 0.02
    for rare in ("is_follow", "is_comment", "is_forward", "is_hate"):
        assert rates[rare] <= 0.01
    lengths = np.unique(log["user_id"], return_counts=True)[1]
    assert lengths.max() > 3 * np.median(lengths)  # heavy tail
    videos, plays = np.unique(log["video_id"], return_counts=True)
    assert 0.2 * n < len(videos) < 0.7 * n  # popular videos repeat, most are seen once
    assert plays.max() > 20
    same_user = np.diff(log["user_id"]) == 0
    gaps = np.diff(log["time_ms"])[same_user]
    gaps = gaps[gaps > 0]
    assert np.median(gaps) < 120_000  # back-to-back plays within sessions
    assert (gaps > 10 * 60_000).mean() > 0.01  # and breaks of many minutes between them
    assert (np.diff(log["time_ms"])[same_user] == 0).any() or n < 5_000  # same-ms ties occur


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        synthesize(tmp_path, users=0, seed=1)
    with pytest.raises(ValueError):
        synthesize(tmp_path, users=3, seed=1, events_per_user_scale=0)
