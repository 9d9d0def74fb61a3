"""Files written whole, and strict JSON."""

import json
import math
import os

import pytest

from hstu_replay.output import files
from hstu_replay.output.files import atomic_write, json_bytes, jsonable


def test_atomic_write_failure_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["report.json"]


def test_atomic_write_uses_normal_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    path = atomic_write(tmp_path / "x", b"1")
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_jsonable():
    from pathlib import Path

    import numpy as np

    assert jsonable({1: (math.inf, np.int64(3), np.float64(2.5), Path("/x"))}) == {
        "1": [None, 3, 2.5, "/x"]}
    assert jsonable(True) is True


def test_strict_json_ends_in_one_newline():
    data = jsonable({"a": math.nan, 1: (1.5, math.inf)})
    text = json_bytes(data)
    assert text.endswith(b"}\n") and json.loads(text) == data
