"""write_tensor_file / write_dump_batch / write_feature_keys produce what NVIDIA's exporter does."""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from hstu_replay.dumps.archive import read_feature_keys, read_tensor_file
from hstu_replay.dumps.writer import (
    write_dump_batch,
    write_feature_keys,
    write_tensor_file,
)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


@pytest.mark.parametrize("array", [
    np.arange(-3, 5, dtype=np.int64),
    np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8),
    np.arange(12, dtype=np.int64).reshape(3, 4).T,  # non-contiguous input
    np.array(5, dtype=np.int64),
    np.zeros((0, 8), dtype=np.float32),
    np.array([True, False]),
    np.array([1.5, -2.0], dtype=np.float64),
], ids=["int64", "float32", "transposed", "zero_dim", "empty", "bool", "float64"])
def test_written_file_loads_with_torch_and_with_our_reader(tmp_path: Path,
                                                           array: np.ndarray) -> None:
    path = write_tensor_file(tmp_path / "batch_000000_x.pt", array)
    loaded = torch.jit.load(str(path)).tensor
    np.testing.assert_array_equal(loaded.numpy(), array)
    got = read_tensor_file(path)
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_torch_tensors_are_written_as_is(tmp_path: Path) -> None:
    t = torch.tensor([[1.5, -0.25]], dtype=torch.bfloat16)
    path = write_tensor_file(tmp_path / "b.pt", t)
    assert torch.jit.load(str(path)).tensor.dtype == torch.bfloat16
    np.testing.assert_array_equal(read_tensor_file(path), [[1.5, -0.25]])


def test_archive_layout_and_pickle_globals(tmp_path: Path) -> None:
    """Zip: <stem>/data.pkl, <stem>/data/0, code; the pickle names only admitted globals."""
    path = write_tensor_file(tmp_path / "batch_000003_values.pt", np.arange(4))
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        pkl = z.read("batch_000003_values/data.pkl")
    assert {"batch_000003_values/data.pkl", "batch_000003_values/data/0"} <= names
    assert any(n.startswith("batch_000003_values/code/") for n in names)
    globals_ = {str(arg) for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"}
    assert {g for g in globals_ if not g.startswith("__torch__")} == {
        "torch._utils _rebuild_tensor_v2", "torch LongStorage", "collections OrderedDict"}
    module = torch.jit.load(str(path))
    assert [n for n, _ in module.named_buffers()] == ["tensor"]
    assert list(module.named_parameters()) == []


def test_write_dump_batch_names_files(tmp_path: Path) -> None:
    paths = write_dump_batch(tmp_path / "dump", 7, {
        "values": np.arange(3), "compiled_logits": np.zeros((1, 8), np.float32)})
    assert sorted(p.name for p in paths) == ["batch_000007_compiled_logits.pt",
                                             "batch_000007_values.pt"]
    assert all(p.parent == tmp_path / "dump" for p in paths)


@pytest.mark.parametrize("index, name", [(-1, "values"), (0, "../values"), (0, "a b"), (0, "")])
def test_write_dump_batch_rejects_bad_names(tmp_path: Path, index: int, name: str) -> None:
    with pytest.raises(ValueError):
        write_dump_batch(tmp_path, index, {name: np.arange(1)})


def test_feature_keys_round_trip(tmp_path: Path) -> None:
    path = write_feature_keys(tmp_path, ("user_id", "video_id"))
    assert path.name == "feature_keys.pt"
    assert torch.load(path) == ["user_id", "video_id"]
    assert read_feature_keys(path) == ["user_id", "video_id"]
