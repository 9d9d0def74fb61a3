"""read_dump / iter_dump: grouping, ordering, dtype checks, and reading without torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.dumps import DumpBatch, iter_dump, read_dump, read_dump_feature_keys
from hstu_replay.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def kvcache_batch(seed: int, users: int = 2) -> dict[str, np.ndarray]:
    """Tensors shaped like the kv-cache exporter's (8 features per user)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=8 * users).astype(np.int64)
    candidates = rng.integers(1, 4, size=users).astype(np.int64)
    return {
        "values": rng.integers(0, 10**9, size=int(lengths.sum())).astype(np.int64),
        "lengths": lengths,
        "num_candidates": candidates,
        "user_ids": np.arange(users, dtype=np.int64) + 100 * seed,
        "total_history_lengths": rng.integers(6, 50, size=users).astype(np.int64),
        "compiled_logits": rng.standard_normal((int(candidates.sum()), 8)).astype(np.float32),
        "compiled_offload_task_ids": np.array([seed], dtype=np.int64),
    }


def write(directory: Path, index: int, tensors: dict[str, np.ndarray]) -> None:
    from hstu_replay.dumps.writer import write_dump_batch

    write_dump_batch(directory, index, tensors)


@pytest.fixture(scope="module")
def kv_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict]]:
    from hstu_replay.dumps.writer import write_feature_keys

    directory = tmp_path_factory.mktemp("kv_dump")
    batches = {i: kvcache_batch(i) for i in (2, 0, 1)}  # written out of order
    for index, tensors in batches.items():
        write(directory, index, tensors)
    write_feature_keys(directory, ["user_id", "video_id"])
    (directory / "README.txt").write_text("not a batch")
    (directory / "batch_x_values.pt").write_text("not matching the pattern either")
    (directory / "batch_000009_values.pt.tmp").write_text("nor this")
    return directory, batches


def test_round_trip(kv_dump: tuple[Path, dict[int, dict]]) -> None:
    directory, written = kv_dump
    batches = read_dump(directory)
    assert [b.index for b in batches] == [0, 1, 2]
    assert [b.name for b in batches] == ["batch_000000", "batch_000001", "batch_000002"]
    for batch in batches:
        assert isinstance(batch, DumpBatch)
        expected = written[batch.index]
        assert set(batch.tensors) == set(expected)
        for name, array in expected.items():
            assert batch.tensors[name].dtype == array.dtype
            np.testing.assert_array_equal(batch.tensors[name], array)
        assert batch.logits is batch.tensors["compiled_logits"]
    assert read_dump_feature_keys(directory) == ["user_id", "video_id"]


def test_iter_dump_is_lazy_and_ordered(kv_dump: tuple[Path, dict[int, dict]]) -> None:
    it = iter_dump(kv_dump[0])
    assert next(it).index == 0
    assert [b.index for b in it] == [1, 2]


def test_nocache_dump_with_ref_logits(tmp_path: Path) -> None:
    tensors = {k: v for k, v in kvcache_batch(5).items()
               if k in ("values", "lengths", "num_candidates")}
    tensors["ref_logits"] = np.ones((int(tensors["num_candidates"].sum()), 8), np.float32)
    write(tmp_path, 12, tensors)
    (batch,) = read_dump(tmp_path)
    assert (batch.name, batch.index) == ("batch_000012", 12)
    assert batch.logits is batch.tensors["ref_logits"]
    assert read_dump_feature_keys(tmp_path) is None


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such dump directory"):
        read_dump(tmp_path / "absent")
    with pytest.raises(InputError, match="no such dump directory"):
        iter_dump(tmp_path / "absent")  # listing errors come at call time, not first next()


def test_directory_without_batches(tmp_path: Path) -> None:
    (tmp_path / "feature_keys.pt").write_bytes(b"")
    with pytest.raises(InputError, match="no batch_NNNNNN_<name>.pt files"):
        read_dump(tmp_path)


def test_batch_lacking_required_input(tmp_path: Path) -> None:
    write(tmp_path, 0, kvcache_batch(0))
    partial = kvcache_batch(1)
    del partial["num_candidates"]
    write(tmp_path, 1, partial)
    with pytest.raises(InputError, match="batch_000001 lacks num_candidates"):
        read_dump(tmp_path)


@pytest.mark.parametrize("name, array, expected", [
    ("values", np.arange(4, dtype=np.float32), "expected 1-D int64, found float32 [4]"),
    ("lengths", np.arange(4, dtype=np.int32), "expected 1-D int64, found int32 [4]"),
    ("num_candidates", np.ones((2, 1), dtype=np.int64), "expected 1-D int64, found int64 [2, 1]"),
    ("user_ids", np.array(3, dtype=np.int64), "expected 1-D int64, found int64 []"),
    ("compiled_logits", np.zeros((3, 7), np.float32),
     "expected float32 [N, 8], found float32 [3, 7]"),
    ("ref_logits", np.zeros((3, 8), np.float64), "expected float32 [N, 8], found float64 [3, 8]"),
    ("compiled_logits", np.zeros(8, np.float32), "expected float32 [N, 8], found float32 [8]"),
    ("compiled_offload_task_ids", np.zeros(2, np.float32), "expected int64, found float32"),
])
def test_wrong_dtype_or_shape(tmp_path: Path, name: str, array: np.ndarray,
                              expected: str) -> None:
    tensors = kvcache_batch(0)
    tensors[name] = array
    write(tmp_path, 0, tensors)
    with pytest.raises(InputError, match=re.escape(f"batch_000000_{name}.pt: {expected}")):
        read_dump(tmp_path)


def test_unknown_tensors_are_kept_unchecked(tmp_path: Path) -> None:
    tensors = kvcache_batch(0)
    tensors["extra"] = np.zeros((2, 3), np.float64)
    write(tmp_path, 0, tensors)
    assert read_dump(tmp_path)[0].tensors["extra"].shape == (2, 3)


def test_corrupt_tensor_file_names_it(tmp_path: Path) -> None:
    write(tmp_path, 0, kvcache_batch(0))
    path = tmp_path / "batch_000000_lengths.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match="batch_000000_lengths.pt: not a readable zip"):
        read_dump(tmp_path)


def test_two_spellings_of_one_index(tmp_path: Path) -> None:
    write(tmp_path, 1, kvcache_batch(1))
    (tmp_path / "batch_0000001_values.pt").write_bytes(
        (tmp_path / "batch_000001_values.pt").read_bytes())
    with pytest.raises(InputError, match="claim batch 1"):
        read_dump(tmp_path)


def test_hostile_feature_keys_do_not_affect_batches(kv_dump: tuple[Path, dict[int, dict]],
                                                    tmp_path: Path) -> None:
    import shutil
    import zipfile

    directory = tmp_path / "dump"
    shutil.copytree(kv_dump[0], directory)
    marker = tmp_path / "pwned"
    (directory / "feature_keys.pt").unlink()
    with zipfile.ZipFile(directory / "feature_keys.pt", "w") as z:
        z.writestr("feature_keys/data.pkl", b"\x80\x02cos\nsystem\n(X" + len(
            f"touch {marker}").to_bytes(4, "little") + f"touch {marker}".encode() + b"tR.")
    assert len(read_dump(directory)) == 3  # feature_keys.pt is not unpickled by read_dump
    with pytest.raises(InputError, match="refuses pickle global os.system"):
        read_dump_feature_keys(directory)
    assert not marker.exists()


def test_reader_works_without_torch(kv_dump: tuple[Path, dict[int, dict]]) -> None:
    """A load-generator host has no torch: block its import and read the dump."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from hstu_replay.dumps import read_dump, read_dump_feature_keys\n"
        "b = read_dump(sys.argv[1])\n"
        "print(len(b), int(b[2].tensors['values'].sum()), b[1].tensors['compiled_logits'].dtype,"
        " read_dump_feature_keys(sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", code, str(kv_dump[0])], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    values_sum = int(kv_dump[1][2]["values"].sum())
    assert out.stdout.split() == ["3", str(values_sum), "float32", "['user_id',", "'video_id']"]
