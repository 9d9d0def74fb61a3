"""`hstu-replay data ...` through cli.main: output, and exactly one stderr line per error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hstu_replay import cli
from hstu_replay.data import schema
from hstu_replay.data.store import SequenceStore

SAMPLE = Path(__file__).resolve().parents[2] / "datasets" / "sample"


@pytest.fixture(autouse=True)
def only_the_data_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep these tests independent of the other command groups (built by others)."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", {"data": "hstu_replay.data.cli"})


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("hstu-replay: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_synth_prepare_inspect_json(tmp_path, capsys):
    raw, store_dir = tmp_path / "raw", tmp_path / "store"
    code, out, _ = run(capsys, "data", "synth", "--out", str(raw), "--users", "9", "--seed", "2",
                       "--scale", "0.005")
    assert code == 0 and out.startswith(f"wrote {raw}: 9 users")
    code, out, _ = run(capsys, "data", "prepare", str(raw), "--out", str(store_dir))
    assert code == 0
    assert len(out.splitlines()) == 1 and out.startswith(f"prepared {store_dir}: ")
    assert " s\n" in out
    code, out, _ = run(capsys, "data", "inspect", str(store_dir), "--json")
    assert code == 0
    assert len(out.strip().splitlines()) == 1
    doc = json.loads(out)
    store = SequenceStore.open(store_dir)
    assert doc["users"] == store.num_users and doc["events"] == store.num_events
    assert [u["user_id"] for u in doc["per_user"]] == store.user_ids.tolist()
    for row, user in zip(doc["per_user"], store):
        assert row["events"] == len(user)
        assert row["context"] == list(user.context)
        assert row["video_ids_sum"] == int(user.video_ids.sum())
        assert row["actions_sum"] == int(user.actions.astype(int).sum())
        assert row["first_video_id"] == int(user.video_ids[0])
        assert row["last_video_id"] == int(user.video_ids[-1])
    assert sum(u["events"] for u in doc["per_user"]) == doc["events"]


def test_inspect_text_and_verify_on_the_sample(tmp_path, capsys):
    store_dir = tmp_path / "store"
    code, out, _ = run(capsys, "data", "prepare", str(SAMPLE), "--out", str(store_dir),
                       "--include-random")
    assert code == 0
    code, out, _ = run(capsys, "data", "inspect", str(store_dir))
    assert code == 0
    assert "users     22 (dropped: 2 in one period only, 0 without user features)" in out
    assert "(standard + random logs)" in out
    assert "is_click" in out and schema.LOG_RANDOM in out
    code, out, _ = run(capsys, "data", "verify", str(store_dir))
    assert code == 0 and "checksum ok" in out


def test_prepare_missing_raw_dir(tmp_path, capsys):
    code, _, err = run(
        capsys, "data", "prepare", str(tmp_path / "nope"), "--out", str(tmp_path / "s")
    )
    assert_one_line_error(code, err, "nope", "not a directory")


def test_prepare_bad_csv(tmp_path, capsys, write_raw):
    from .conftest import log_line

    raw = write_raw(period1=[log_line(1, 1, 1), "1,2"], period2=[log_line(1, 2, 2)])
    code, _, err = run(capsys, "data", "prepare", str(raw), "--out", str(tmp_path / "s"))
    assert_one_line_error(code, err, schema.LOG_PERIOD1, "line 3", "expected 19 columns, got 2")


def test_prepare_into_a_foreign_directory(tmp_path, capsys, write_raw):
    from .conftest import log_line

    raw = write_raw(period1=[log_line(1, 1, 1)], period2=[log_line(1, 2, 2)])
    code, _, err = run(capsys, "data", "prepare", str(raw), "--out", str(raw))
    assert code == 2
    assert_one_line_error(code, err, "not a sequence store")


def test_inspect_not_a_store(tmp_path, capsys):
    code, _, err = run(capsys, "data", "inspect", str(tmp_path), "--json")
    assert_one_line_error(code, err, "meta.json missing")


def test_verify_corrupt_store(tmp_path, capsys):
    store_dir = tmp_path / "store"
    assert run(capsys, "data", "prepare", str(SAMPLE), "--out", str(store_dir))[0] == 0
    path = store_dir / "times_ms.npy"
    data = bytearray(path.read_bytes())
    data[200] ^= 0x40
    path.write_bytes(bytes(data))
    code, _, err = run(capsys, "data", "verify", str(store_dir))
    assert_one_line_error(code, err, "checksum mismatch")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--full", "--users", "5"], "--full fixes"),
        ([], "give --users"),
        (["--users", "0"], "--users must be >= 1"),
        (["--users", "3", "--scale", "0"], "--scale must be > 0"),
        (["--users", "3", "--seed", "-1"], "--seed must be >= 0"),
    ],
)
def test_synth_option_errors(tmp_path, capsys, args, fragment):
    code, _, err = run(capsys, "data", "synth", "--out", str(tmp_path / "raw"), *args)
    assert code == 2
    assert_one_line_error(code, err, fragment)
