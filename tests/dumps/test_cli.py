"""`hstu-replay dump inspect`: JSON statistics, the human summary, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hstu_replay import cli

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

BATCH0 = {
    "values": np.array([5, -3, 2**40, 7], dtype=np.int64),
    "lengths": np.array([1, 1, 1, 1], dtype=np.int64),
    "num_candidates": np.array([2, 1], dtype=np.int64),
    "compiled_logits": np.array([[0.5] * 8, [-1.25] * 8, [2.0] * 8], dtype=np.float32),
    "compiled_offload_task_ids": np.zeros(0, dtype=np.int64),
}
BATCH1 = {
    "values": np.array([9], dtype=np.int64),
    "lengths": np.array([1], dtype=np.int64),
    "num_candidates": np.array([4], dtype=np.int64),
}


@pytest.fixture(autouse=True)
def only_the_dump_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep these tests independent of the other command groups (built by others)."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", {"dump": "hstu_replay.dumps.cli"})


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    from hstu_replay.dumps.writer import write_dump_batch, write_feature_keys

    write_dump_batch(tmp_path, 0, BATCH0)
    write_dump_batch(tmp_path, 1, BATCH1)
    write_feature_keys(tmp_path, ["user_id", "video_id"])
    return tmp_path


def test_inspect_json(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dump", "inspect", str(dump), "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert list(report) == ["batches"]
    assert [b["name"] for b in report["batches"]] == ["batch_000000", "batch_000001"]
    t = report["batches"][0]["tensors"]
    assert set(t) == set(BATCH0)
    assert t["values"] == {"dtype": "int64", "shape": [4], "min": -3, "max": 2**40,
                           "sum": 2**40 + 9}
    assert t["num_candidates"] == {"dtype": "int64", "shape": [2], "min": 1, "max": 2, "sum": 3}
    assert t["compiled_logits"] == {"dtype": "float32", "shape": [3, 8], "min": -1.25,
                                    "max": 2.0, "sum": 10.0}
    assert isinstance(t["compiled_logits"]["sum"], float)
    assert t["compiled_offload_task_ids"] == {"dtype": "int64", "shape": [0], "min": None,
                                              "max": None, "sum": 0}
    assert report["batches"][1]["tensors"]["values"]["sum"] == 9


def test_integer_sums_are_exact_beyond_int64(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from hstu_replay.dumps.writer import write_dump_batch

    big = np.full(4, 2**62, dtype=np.int64)
    write_dump_batch(tmp_path, 0, {**BATCH1, "values": big})
    assert cli.main(["dump", "inspect", str(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["batches"][0]["tensors"]["values"]
    assert stats["sum"] == 2**64


def test_inspect_human(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dump", "inspect", str(dump)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"{dump}: 2 batches, feature keys user_id, video_id",
        "batch_000000: 2 users, 4 values, 3 candidates, compiled_logits [3, 8]",
        "batch_000001: 1 users, 1 values, 4 candidates, no logits",
    ]


@pytest.mark.parametrize("as_json", [True, False])
def test_corrupt_file_gives_one_line_and_nonzero_exit(dump: Path, as_json: bool,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = dump / "batch_000001_values.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    rc = cli.main(["dump", "inspect", str(dump)] + (["--json"] if as_json else []))
    out, err = capsys.readouterr()
    assert rc != 0
    assert out == ""
    assert len(err.splitlines()) == 1 and err.endswith("\n")
    assert "batch_000001_values.pt" in err and "Traceback" not in err


def test_hostile_file_is_refused(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import zipfile

    marker = dump / "pwned"
    cmd = f"touch {marker}".encode()
    path = dump / "batch_000000_lengths.pt"
    path.unlink()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("batch_000000_lengths/data.pkl",
                   b"\x80\x02cos\nsystem\n(X" + len(cmd).to_bytes(4, "little") + cmd + b"tR.")
    assert cli.main(["dump", "inspect", str(dump), "--json"]) != 0
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "refuses pickle global os.system" in err
    assert not marker.exists()


def test_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dump", "inspect", str(tmp_path / "absent")]) == 1
    err = capsys.readouterr().err
    absent = tmp_path / "absent"
    assert err.splitlines() == [f"hstu-replay: error: {absent}: no such dump directory"]
