"""`prepare`: NVIDIA's sequence rules on hand-written files, and one-line errors on bad ones."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hstu_replay.data import schema
from hstu_replay.data.prepare import prepare
from hstu_replay.data.store import SequenceStore
from hstu_replay.errors import InputError

from .conftest import log_line, log_text

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "sample"


def sequences(store: SequenceStore) -> dict[int, list[tuple[int, int, int]]]:
    """user -> [(video, action, time), ...] in stored order."""
    out = {}
    for user in store:
        out[user.user_id] = list(
            zip(user.video_ids.tolist(), user.actions.tolist(), user.times_ms.tolist())
        )
    return out


def open_prepared(raw: Path, tmp_path: Path, **kwargs) -> SequenceStore:
    prepare(raw, tmp_path / "store", **kwargs)
    return SequenceStore.open(tmp_path / "store")


# --- sequence rules ---------------------------------------------------------------------------


def test_action_bitmask_is_sum_of_set_flag_weights(write_raw, tmp_path):
    raw = write_raw(
        period1=[
            log_line(1, 10, 100),
            log_line(1, 11, 101, is_click=1),
            log_line(1, 12, 102, is_click=1, long_view=1),
            log_line(1, 13, 103, is_like=1, is_follow=1, is_comment=1, is_forward=1),
            log_line(1, 14, 104, is_hate=1, is_profile_enter=1),
        ],
        period2=[
            log_line(
                1, 15, 200, is_click=1, is_like=1, is_follow=1, is_comment=1, is_forward=1,
                is_hate=1, long_view=1, is_profile_enter=1,
            ),
            log_line(1, 16, 201, is_click=2),  # non-zero counts as set
            log_line(1, 17, 202, play_time_ms=5, tab=3, is_rand=0),  # other columns: no effect
        ],
    )
    store = open_prepared(raw, tmp_path)
    assert store.user(0).actions.tolist() == [0, 1, 65, 2 + 4 + 8 + 16, 32 + 128, 255, 1, 0]
    assert store.actions.dtype == np.uint8


def test_periods_concatenated_then_stably_sorted_by_time(write_raw, tmp_path):
    raw = write_raw(
        period1=[
            log_line(1, 10, 500),
            log_line(1, 11, 300),  # out of order within the file: sorted
            log_line(1, 12, 700),  # tie with period 2's video 20: period 1 first
            log_line(1, 13, 700),  # tie within a file: file order
        ],
        period2=[
            log_line(1, 20, 700),
            log_line(1, 21, 100),  # earlier than all of period 1: moves to the front
            log_line(1, 22, 900),
        ],
    )
    store = open_prepared(raw, tmp_path)
    user = store.user(0)
    assert user.video_ids.tolist() == [21, 11, 10, 12, 13, 20, 22]
    assert user.times_ms.tolist() == [100, 300, 500, 700, 700, 700, 900]


def test_users_sorted_and_interleaved_rows_grouped(write_raw, tmp_path):
    raw = write_raw(
        period1=[log_line(2, 1, 50), log_line(1, 2, 60), log_line(2, 3, 40)],
        period2=[log_line(1, 4, 70), log_line(2, 5, 80)],
    )
    store = open_prepared(raw, tmp_path)
    assert store.user_ids.tolist() == [1, 2]
    assert store.offsets.tolist() == [0, 2, 5]
    assert sequences(store)[2] == [(3, 0, 40), (1, 0, 50), (5, 0, 80)]


def test_users_in_one_period_or_without_features_are_dropped(write_raw, tmp_path):
    raw = write_raw(
        period1=[log_line(1, 1, 1), log_line(2, 2, 2), log_line(9, 9, 9), log_line(3, 3, 3)],
        period2=[log_line(1, 4, 10), log_line(3, 5, 11), log_line(4, 6, 12), log_line(9, 7, 13)],
    )
    store = open_prepared(raw, tmp_path)
    assert store.user_ids.tolist() == [1, 3]  # 2 only in period 1, 4 only in 2, 9 no features
    assert store.meta.dropped.one_period_only == 2
    assert store.meta.dropped.no_user_features == 1
    assert store.num_events == 4


def test_context_codes_follow_first_appearance_in_user_features(write_raw, tmp_path):
    features = [
        (30, "full_active", "(50,100]", "[1k,5k)", "0", "366-730"),
        (7, "UNKNOWN", "(0,10]", "[1k,5k)", "[5,30)", "15-30"),  # in no log: still coded
        (10, "high_active", "(50,100]", "0", "[5,30)", "31-60"),
        (20, "full_active", "(0,10]", "[1,10)", "0", "366-730"),
    ]
    both = [log_line(u, 1, 1) for u in (10, 20, 30)]
    raw = write_raw(period1=both, period2=both, features=features)
    store = open_prepared(raw, tmp_path)
    assert store.user_ids.tolist() == [10, 20, 30]
    assert store.context.tolist() == [
        [3, 1, 2, 2, 3],  # user 10
        [1, 2, 3, 1, 1],  # user 20
        [1, 1, 1, 1, 1],  # user 30
    ]
    assert store.user(1).context == (1, 2, 3, 1, 1)


def test_quoted_commas_in_user_features_parse_as_one_field(write_raw, tmp_path):
    features = [
        (1, "high_active", "(0,10]", "[1,10)", "[1,5)", "15-30"),
        (2, "high_active", "(10,50]", "[1,10)", "[5,30)", "15-30"),
    ]
    both = [log_line(1, 1, 1), log_line(2, 2, 2)]
    raw = write_raw(period1=both, period2=both, features=features)
    text = (raw / schema.USER_FEATURES).read_text()
    assert '"(0,10]"' in text and '"[1,10)"' in text
    store = open_prepared(raw, tmp_path)
    assert store.context.tolist() == [[1, 1, 1, 1, 1], [1, 2, 1, 2, 1]]


def test_random_log_is_appended_before_sorting_only_when_asked(write_raw, tmp_path):
    raw = write_raw(
        period1=[log_line(1, 10, 100)],
        period2=[log_line(1, 20, 300)],
        random=[log_line(1, 30, 300, is_rand=1), log_line(1, 31, 50, is_rand=1),
                log_line(2, 32, 60, is_rand=1)],  # user 2 is in no standard log
    )
    plain = open_prepared(raw, tmp_path / "a")
    assert plain.user(0).video_ids.tolist() == [10, 20]
    assert not plain.meta.include_random
    with_random = open_prepared(raw, tmp_path / "b", include_random=True)
    assert with_random.user(0).video_ids.tolist() == [31, 10, 20, 30]
    assert with_random.user_ids.tolist() == [1]
    assert with_random.meta.include_random
    assert schema.LOG_RANDOM in [s.name for s in with_random.meta.sources]


def test_meta_records_sources_and_counts(write_raw, tmp_path):
    raw = write_raw(period1=[log_line(1, 1, 1)], period2=[log_line(1, 2, 2)])
    meta = prepare(raw, tmp_path / "store")
    assert (meta.users, meta.events) == (1, 2)
    assert [s.name for s in meta.sources] == [
        schema.LOG_PERIOD1, schema.LOG_PERIOD2, schema.USER_FEATURES,
    ]
    assert meta.sources[0].size == (raw / schema.LOG_PERIOD1).stat().st_size
    assert meta.checksum.startswith("sha256:")


# --- agreement with a naive reference ---------------------------------------------------------


def naive_prepare(raw: Path, include_random: bool = False):
    """The rules written the slow obvious way: dicts of lists and Python's stable sorted()."""
    weights = dict(zip(schema.ACTION_COLUMNS, schema.ACTION_WEIGHTS))
    per_file = []
    names = [schema.LOG_PERIOD1, schema.LOG_PERIOD2]
    names += [schema.LOG_RANDOM] if include_random else []
    for name in names:
        events: dict[int, list] = {}
        with open(raw / name, newline="") as f:
            for row in csv.DictReader(f):
                action = sum(w for col, w in weights.items() if int(row[col]) != 0)
                event = (int(row["video_id"]), action, int(row["time_ms"]))
                events.setdefault(int(row["user_id"]), []).append(event)
        per_file.append(events)
    with open(raw / schema.USER_FEATURES, newline="") as f:
        rows = list(csv.DictReader(f))
    codes: dict[str, dict[str, int]] = {c: {} for c in schema.CONTEXT_COLUMNS}
    context = {}
    for row in rows:
        context[int(row["user_id"])] = [
            codes[c].setdefault(row[c], len(codes[c]) + 1) for c in schema.CONTEXT_COLUMNS
        ]
    users = sorted(set(per_file[0]) & set(per_file[1]) & set(context))
    out = {}
    for user in users:
        merged = [e for events in per_file for e in events.get(user, [])]
        out[user] = (context[user], sorted(merged, key=lambda e: e[2]))
    return out


def assert_matches_naive(raw: Path, store: SequenceStore, include_random: bool = False) -> None:
    expected = naive_prepare(raw, include_random)
    assert store.user_ids.tolist() == list(expected)
    for user in store:
        context, events = expected[user.user_id]
        assert list(user.context) == context
        got = list(zip(user.video_ids.tolist(), user.actions.tolist(), user.times_ms.tolist()))
        assert got == events


@pytest.mark.parametrize("include_random", [False, True])
def test_sample_dataset_matches_naive_reference(tmp_path, include_random):
    store = open_prepared(SAMPLE, tmp_path, include_random=include_random)
    assert_matches_naive(SAMPLE, store, include_random)
    assert store.meta.dropped.one_period_only >= 1


event = st.tuples(
    st.integers(1, 4),  # user (1..4 have features)
    st.integers(0, 50),  # video
    st.integers(0, 6),  # time: few values, so many ties
    st.integers(0, 255),  # flags as a bitmask
)


def event_line(e) -> str:
    user, video, t, bits = e
    flags = {name: (bits >> i) & 1 for i, name in enumerate(schema.ACTION_COLUMNS)}
    return log_line(user, video, 1_650_000_000_000 + t, **flags)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    p1=st.lists(event, min_size=1, max_size=25),
    p2=st.lists(event, min_size=1, max_size=25),
    rnd=st.lists(event, max_size=6),
    include_random=st.booleans(),
)
def test_random_logs_match_naive_reference(tmp_path_factory, p1, p2, rnd, include_random):
    raw = tmp_path_factory.mktemp("raw")
    (raw / schema.LOG_PERIOD1).write_text(log_text([event_line(e) for e in p1]))
    (raw / schema.LOG_PERIOD2).write_text(log_text([event_line(e) for e in p2]))
    (raw / schema.LOG_RANDOM).write_text(log_text([event_line(e) for e in rnd]))
    from .conftest import DEFAULT_FEATURES, features_text

    (raw / schema.USER_FEATURES).write_text(features_text(DEFAULT_FEATURES))
    if not {e[0] for e in p1} & {e[0] for e in p2}:
        with pytest.raises(InputError, match="no user is in both"):
            prepare(raw, raw / "store", include_random=include_random)
        return
    prepare(raw, raw / "store", include_random=include_random)
    assert_matches_naive(raw, SequenceStore.open(raw / "store"), include_random)


# --- malformed input --------------------------------------------------------------------------


def one_line_error(raw: Path, tmp_path: Path) -> str:
    with pytest.raises(InputError) as info:
        prepare(raw, tmp_path / "store")
    message = str(info.value)
    assert "\n" not in message
    return message


GOOD1 = [log_line(1, 1, 1), log_line(2, 2, 2), log_line(1, 3, 3)]
GOOD2 = [log_line(1, 4, 4), log_line(2, 5, 5)]


def test_missing_file_is_named(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    (raw / schema.LOG_PERIOD2).unlink()
    message = one_line_error(raw, tmp_path)
    assert schema.LOG_PERIOD2 in message and "not found" in message


def test_missing_columns_are_named(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    path = raw / schema.LOG_PERIOD1
    columns = [c for c in schema.LOG_COLUMNS if c not in ("time_ms", "is_hate")]
    path.write_text(",".join(columns) + "\n1," + ",".join("0" * (len(columns) - 1)) + "\n")
    message = one_line_error(raw, tmp_path)
    assert str(path) in message
    assert "lacks column(s) time_ms, is_hate" in message


def test_missing_user_feature_column_is_named(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    path = raw / schema.USER_FEATURES
    text = path.read_text().replace("fans_user_num_range,", "", 1)
    path.write_text(text)
    assert "lacks column(s) fans_user_num_range" in one_line_error(raw, tmp_path)


def test_non_integer_field_names_line_and_column(write_raw, tmp_path):
    bad = log_line(2, 7, 9).split(",")
    bad[schema.LOG_COLUMNS.index("video_id")] = "12x"
    raw = write_raw(period1=GOOD1 + [",".join(bad)] + GOOD1, period2=GOOD2)
    message = one_line_error(raw, tmp_path)
    assert schema.LOG_PERIOD1 in message
    assert "line 5, column 2 (video_id)" in message
    assert "'12x'" in message and "integer" in message


def test_non_integer_flag_names_line_and_column(write_raw, tmp_path):
    bad = log_line(2, 7, 9).split(",")
    bad[schema.LOG_COLUMNS.index("long_view")] = "yes"
    raw = write_raw(period1=GOOD1, period2=GOOD2 + [",".join(bad)])
    message = one_line_error(raw, tmp_path)
    assert schema.LOG_PERIOD2 in message
    assert "line 4, column 12 (long_view)" in message and "'yes'" in message


def test_empty_field_names_line_and_column(write_raw, tmp_path):
    bad = log_line(2, 7, 9).split(",")
    bad[schema.LOG_COLUMNS.index("time_ms")] = ""
    raw = write_raw(period1=GOOD1 + [",".join(bad)], period2=GOOD2)
    message = one_line_error(raw, tmp_path)
    assert "line 5, column 5 (time_ms): empty value" in message


def test_wrong_column_count_in_the_middle(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1 + ["1,2,3"] + GOOD1, period2=GOOD2)
    message = one_line_error(raw, tmp_path)
    assert "line 5: expected 19 columns, got 3" in message


def test_truncated_last_line_missing_columns(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    path = raw / schema.LOG_PERIOD2
    path.write_bytes(path.read_bytes() + log_line(1, 77, 99).encode()[:20])
    message = one_line_error(raw, tmp_path)
    assert schema.LOG_PERIOD2 in message and "line 4" in message and "columns" in message


def test_truncated_last_line_in_an_unused_column(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    path = raw / schema.LOG_PERIOD2
    cut = log_line(1, 77, 99, tab=14)[:-2]  # "...,0," : the tab field is cut off
    path.write_bytes(path.read_bytes() + cut.encode())
    message = one_line_error(raw, tmp_path)
    assert "line 4: column 19 (tab): invalid value ''" in message
    assert "truncated" in message


def test_empty_file(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    (raw / schema.LOG_PERIOD1).write_text("")
    assert "empty file" in one_line_error(raw, tmp_path)


def test_duplicate_user_in_user_features(write_raw, tmp_path):
    features = [
        (1, "high_active", "0", "0", "0", "15-30"),
        (2, "high_active", "0", "0", "0", "15-30"),
        (1, "full_active", "0", "0", "0", "15-30"),
    ]
    raw = write_raw(period1=GOOD1, period2=GOOD2, features=features)
    assert "line 4: user_id 1 repeats line 2" in one_line_error(raw, tmp_path)


def test_non_integer_user_id_in_user_features(write_raw, tmp_path):
    raw = write_raw(period1=GOOD1, period2=GOOD2)
    path = raw / schema.USER_FEATURES
    lines = path.read_text().splitlines()
    lines[2] = "u2" + lines[2][1:]
    path.write_text("\n".join(lines) + "\n")
    message = one_line_error(raw, tmp_path)
    assert "line 3, column 1 (user_id): invalid value 'u2'" in message


def test_no_common_user(write_raw, tmp_path):
    raw = write_raw(period1=[log_line(1, 1, 1)], period2=[log_line(2, 1, 1)])
    assert "no user is in both" in one_line_error(raw, tmp_path)


def test_large_user_ids_and_wide_time_range_take_the_general_paths(write_raw, tmp_path):
    # ids beyond the lookup-table range -> searchsorted; a time span too wide to pack -> lexsort
    big, other = 10**15, 10**15 + 7
    features = [
        (big, "high_active", "0", "0", "0", "15-30"),
        (other, "UNKNOWN", "0", "0", "0", "730+"),
    ]
    raw = write_raw(
        period1=[log_line(big, 1, 2**61), log_line(other, 2, 5), log_line(big, 3, -4)],
        period2=[log_line(big, 4, 2**61), log_line(big, 5, 0), log_line(99, 6, 1)],
        features=features,
    )
    store = open_prepared(raw, tmp_path)
    assert store.user_ids.tolist() == [big]
    assert store.user(0).video_ids.tolist() == [3, 5, 1, 4]
    assert store.user(0).times_ms.tolist() == [-4, 0, 2**61, 2**61]
    assert store.meta.dropped.one_period_only == 2
    assert_matches_naive(raw, store)


def test_header_only_log(write_raw, tmp_path):
    raw = write_raw(period1=[], period2=[log_line(1, 1, 1)])
    assert "no user is in both" in one_line_error(raw, tmp_path)
