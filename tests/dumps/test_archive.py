"""read_tensor_file / read_feature_keys: torch-made archives, hand-made and hostile ones."""

from __future__ import annotations

import functools
import pickle
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.dumps import archive
from hstu_replay.dumps.archive import read_feature_keys, read_tensor_file
from hstu_replay.errors import InputError

# TorchScript is deprecated in torch 2.x, but it is the format NVIDIA's exporter writes.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

# --- archives as torch.jit.save writes them (see pickletools output in the module docstring) --


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _str(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def _tuple(items: tuple[int, ...]) -> bytes:
    return b"(" + b"".join(map(_int, items)) + b"t"


def module_pickle(storage: str = "LongStorage", numel: int = 3, offset: int = 0,
                  size: tuple[int, ...] = (3,), stride: tuple[int, ...] = (1,),
                  cls: tuple[str, str] = ("__torch__", "M"), attr: str = "tensor",
                  after_tensor: bytes = b"") -> bytes:
    """The opcodes torch.jit.save writes for a module with one buffer (protocol 2)."""
    tensor = (_global("torch._utils", "_rebuild_tensor_v2") + b"(("
              + _str("storage") + _global("torch", storage) + _str("0") + _str("cpu") + _int(numel)
              + b"tQ" + _int(offset) + _tuple(size) + _tuple(stride) + b"\x89"
              + _global("collections", "OrderedDict") + b")RtR" + after_tensor)
    return (b"\x80\x02" + _global(*cls) + b")\x81}(" + _str(attr) + tensor
            + _str("training") + b"\x88" + _str("_is_full_backward_hook") + b"Nub.")


def make_archive(path: Path, pkl: bytes, storage: bytes | None = b"", **extra: bytes) -> Path:
    """A zip laid out like torch's: <stem>/data.pkl, <stem>/data/0, <stem>/byteorder ..."""
    prefix = path.stem
    with zipfile.ZipFile(path, "w") as z:
        if storage is not None:
            z.writestr(f"{prefix}/data/0", storage)
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/version", b"10\n")
        z.writestr(f"{prefix}/byteorder", b"little")
        for name, data in extra.items():
            z.writestr(f"{prefix}/{name}", data)
    return path


def long_archive(path: Path, values: list[int], **kw: object) -> Path:
    data = np.asarray(values, dtype="<i8").tobytes()
    kw.setdefault("numel", len(values))
    kw.setdefault("size", (len(values),))
    return make_archive(path, module_pickle(**kw), data)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=None)
def _nvidia_holder():
    """Built independently of our writer: a scripted module whose only state is `tensor`."""
    import torch

    class Holder(torch.nn.Module):
        def __init__(self, tensor):
            super().__init__()
            self.register_buffer("tensor", tensor)

        def forward(self):
            return self.tensor

    return Holder


def nvidia_save(path: Path, tensor) -> Path:
    import torch

    torch.jit.save(torch.jit.script(_nvidia_holder()(tensor)), str(path))
    return path


def _torch_cases():
    import torch

    g = torch.Generator().manual_seed(0)
    return {
        "int64": torch.arange(-5, 7, dtype=torch.int64) * (2**40),
        "float32": torch.randn(5, 8, generator=g),
        "bfloat16": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "transposed": torch.arange(24, dtype=torch.float32).reshape(4, 6).t(),
        "sliced": torch.arange(30, dtype=torch.int64).reshape(5, 6)[1:4, ::2],
        "zero_dim": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 8),
        "empty_1d": torch.zeros(0, dtype=torch.int64),
        "int32": torch.tensor([1, -2, 3], dtype=torch.int32),
        "int16": torch.tensor([1, -2], dtype=torch.int16),
        "int8": torch.tensor([-128, 127], dtype=torch.int8),
        "uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "float64": torch.tensor([1.0 / 3.0, -2.5], dtype=torch.float64),
        "float16": torch.tensor([0.1, 65504.0], dtype=torch.float16),
    }


@pytest.mark.parametrize("case", sorted(
    ["int64", "float32", "bfloat16", "transposed", "sliced", "zero_dim", "empty", "empty_1d",
     "int32", "int16", "int8", "uint8", "bool", "float64", "float16"]))
def test_reads_archives_saved_by_torch_jit_save(tmp_path: Path, case: str) -> None:
    import torch

    path = nvidia_save(tmp_path / f"batch_000000_{case}.pt", _torch_cases()[case])
    expected = torch.jit.load(str(path)).tensor
    if expected.dtype == torch.bfloat16:
        expected = expected.float()  # we upcast bf16 to float32, exactly
    got = read_tensor_file(path)
    assert got.flags.c_contiguous and got.flags.writeable
    assert got.shape == tuple(expected.shape)
    assert got.dtype == expected.numpy().dtype
    np.testing.assert_array_equal(got, expected.numpy())


def test_hand_made_archive_matches_the_torch_layout(tmp_path: Path) -> None:
    np.testing.assert_array_equal(read_tensor_file(long_archive(tmp_path / "a.pt", [4, 5, 6])),
                                  [4, 5, 6])


def test_module_class_name_may_be_anything_under_torch(tmp_path: Path) -> None:
    path = long_archive(tmp_path / "a.pt", [1], cls=("__torch__.x.___torch_mangle_3", "Holder"))
    assert read_tensor_file(path).tolist() == [1]


def test_bfloat16_is_upcast_bit_exactly(tmp_path: Path) -> None:
    bits = np.array([0x3FC0, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x7FC1], dtype="<u2")
    pkl = module_pickle("BFloat16Storage", numel=6, size=(6,))
    got = read_tensor_file(make_archive(tmp_path / "a.pt", pkl, bits.tobytes()))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), bits.astype(np.uint32) << 16)


def test_bool_bytes_are_normalised(tmp_path: Path) -> None:
    pkl = module_pickle("BoolStorage", numel=3, size=(3,))
    got = read_tensor_file(make_archive(tmp_path / "a.pt", pkl, bytes([0, 2, 1])))
    assert got.tolist() == [False, True, True]
    assert got.view(np.uint8).tolist() == [0, 1, 1]


def test_strided_view_of_the_storage(tmp_path: Path) -> None:
    path = long_archive(tmp_path / "a.pt", list(range(10)), offset=1, size=(3, 2), stride=(3, 1))
    assert read_tensor_file(path).tolist() == [[1, 2], [4, 5], [7, 8]]


# --- hostile pickles: refused before anything runs -------------------------------------------

def _call_pickle(module: str, name: str, arg: str) -> bytes:
    """A pickle that calls module.name(arg): what an attacker puts in data.pkl."""
    return b"\x80\x02" + _global(module, name) + b"(" + _str(arg) + b"tR."


@pytest.mark.parametrize("module, name", [
    ("os", "system"), ("posix", "system"), ("subprocess", "getoutput"),
    ("builtins", "eval"), ("builtins", "exec"), ("__builtin__", "eval"),
])
def test_refuses_globals_that_run_code(tmp_path: Path, module: str, name: str) -> None:
    marker = tmp_path / "pwned"
    if name in ("eval", "exec"):
        arg = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    else:
        arg = f"touch {marker}"
    path = make_archive(tmp_path / "a.pt", _call_pickle(module, name, arg))
    with pytest.raises(InputError, match=rf"a\.pt: refuses pickle global {module}\.{name}"):
        read_tensor_file(path)
    assert not marker.exists()


def test_refuses_os_system_hidden_inside_the_tensor(tmp_path: Path) -> None:
    """The call sits where the rebuild arguments go, after the admitted globals."""
    marker = tmp_path / "pwned"
    evil = _global("os", "system") + b"(" + _str(f"touch {marker}") + b"tR0"
    path = make_archive(tmp_path / "a.pt", module_pickle(after_tensor=evil),
                        np.zeros(3, "<i8").tobytes())
    with pytest.raises(InputError, match=r"a\.pt: refuses pickle global os\.system"):
        read_tensor_file(path)
    assert not marker.exists()


def test_refuses_a_reduce_pickle_made_by_pickle_dumps(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os
            return os.system, (f"touch {marker}",)

    path = make_archive(tmp_path / "a.pt", pickle.dumps(Evil(), protocol=2))
    with pytest.raises(InputError, match="refuses pickle global"):
        read_tensor_file(path)
    assert not marker.exists()


def test_hostile_pickle_inside_a_valid_torch_archive(tmp_path: Path) -> None:
    import torch

    good = nvidia_save(tmp_path / "good.pt", torch.arange(3))
    marker = tmp_path / "pwned"
    bad = tmp_path / "good_copy.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("/data.pkl"):
                data = _call_pickle("os", "system", f"touch {marker}")
            dst.writestr(info, data)
    with pytest.raises(InputError, match=r"refuses pickle global os\.system"):
        read_tensor_file(bad)
    assert not marker.exists()
    assert read_tensor_file(good).tolist() == [0, 1, 2]


@pytest.mark.parametrize("build_step", [b"}b", b"(tb"])
def test_refuses_setting_state_on_the_rebuilt_tensor(tmp_path: Path, build_step: bytes) -> None:
    path = make_archive(tmp_path / "a.pt", module_pickle(after_tensor=build_step),
                        np.zeros(3, "<i8").tobytes())
    with pytest.raises(InputError, match="a.pt: "):
        read_tensor_file(path)


# --- damaged or inconsistent archives ------------------------------------------------------

def test_storage_shorter_than_declared(tmp_path: Path) -> None:
    pkl = module_pickle(numel=4, size=(4,))
    path = make_archive(tmp_path / "a.pt", pkl, np.zeros(3, "<i8").tobytes())
    with pytest.raises(InputError, match="storage 0 holds 24 bytes but declares 4"):
        read_tensor_file(path)


@pytest.mark.parametrize("kw, message", [
    ({"size": (4,)}, "reaches element 3"),
    ({"offset": 3, "size": (1,)}, "reaches element 3"),
    ({"offset": 4, "size": (0,)}, "past the end"),
    ({"size": (2, 2), "stride": (2, 1)}, "reaches element 3"),
    ({"size": (2,), "stride": (-1,)}, "negative"),
    ({"offset": -1, "size": (1,)}, "negative"),
    ({"size": (2,), "stride": (1, 1)}, "malformed"),
    ({"size": (2**30, 2**30), "stride": (0, 0)}, "exceeds"),
])
def test_view_must_stay_inside_the_storage(tmp_path: Path, kw: dict, message: str) -> None:
    path = long_archive(tmp_path / "a.pt", [1, 2, 3], **kw)
    with pytest.raises(InputError, match=message):
        read_tensor_file(path)


def test_truncated_archives_are_refused_at_every_length(tmp_path: Path) -> None:
    whole = long_archive(tmp_path / "a.pt", [1, 2, 3]).read_bytes()
    cut = tmp_path / "cut.pt"
    for length in range(len(whole)):
        cut.write_bytes(whole[:length])
        with pytest.raises(InputError) as err:
            read_tensor_file(cut)
        assert "\n" not in str(err.value)


def test_a_corrupted_byte_is_refused_in_one_line_or_changes_nothing_read(tmp_path: Path) -> None:
    """Each byte flipped in turn: a one-line InputError, or (a byte the reader does not use, such
    as a time stamp) the very same values; a flipped byte of the tensor's data is always refused."""
    whole = bytearray(long_archive(tmp_path / "a.pt", [1, 2, 3]).read_bytes())
    with zipfile.ZipFile(tmp_path / "a.pt") as z:
        member = z.getinfo("a/data/0")
    start = member.header_offset + 30 + len(member.filename) + len(member.extra)  # after the local header
    data = range(start, start + member.compress_size)
    bad = tmp_path / "bad.pt"
    refused = set()
    for i in range(len(whole)):
        flipped = bytearray(whole)
        flipped[i] ^= 0xFF
        bad.write_bytes(bytes(flipped))
        try:
            values = read_tensor_file(bad)
        except InputError as exc:
            assert "\n" not in str(exc)
            refused.add(i)
        else:
            assert values.tolist() == [1, 2, 3], f"byte {i} flipped, read as {values.tolist()}"
    assert set(data) <= refused and len(data) == 24


def test_torch_archive_cut_in_half(tmp_path: Path) -> None:
    import torch

    path = nvidia_save(tmp_path / "t.pt", torch.arange(1000))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(InputError, match="t.pt: not a readable zip archive"):
        read_tensor_file(path)


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04garbage"])
def test_not_a_zip(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(InputError, match="x.pt: "):
        read_tensor_file(path)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_tensor_file(tmp_path / "absent.pt")
    with pytest.raises(InputError, match="not a readable zip"):
        read_tensor_file(tmp_path)


def test_missing_storage_member(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "a.pt", module_pickle(), storage=None)
    with pytest.raises(InputError, match="missing archive member a/data/0"):
        read_tensor_file(path)


def test_zip_without_data_pkl(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a/version", b"10")
    with pytest.raises(InputError, match="not a torch archive"):
        read_tensor_file(path)


def test_big_endian_archives_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a/data.pkl", module_pickle())
        z.writestr("a/data/0", bytes(24))
        z.writestr("a/byteorder", b"big")
    with pytest.raises(InputError, match="byte order"):
        read_tensor_file(path)


def test_member_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = long_archive(tmp_path / "a.pt", list(range(100)))
    monkeypatch.setattr(archive, "MAX_MEMBER_BYTES", 512)
    with pytest.raises(InputError, match="over the 512-byte limit"):
        read_tensor_file(path)


def test_tensor_under_another_name_is_refused(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "a.pt", module_pickle(attr="other"), bytes(24))
    with pytest.raises(InputError, match="'other' is neither the 'tensor' buffer"):
        read_tensor_file(path)


def test_module_without_tensor_is_refused(tmp_path: Path) -> None:
    pkl = b"\x80\x02" + _global("__torch__", "M") + b")\x81}(" + _str("training") + b"\x88ub."
    with pytest.raises(InputError, match="no buffer named 'tensor'"):
        read_tensor_file(make_archive(tmp_path / "a.pt", pkl, None))


def test_module_with_a_second_tensor_is_refused(tmp_path: Path) -> None:
    pkl = module_pickle()
    second = pkl[pkl.index(b"c" + b"torch._utils"): pkl.index(_str("training"))]
    pkl = pkl.replace(_str("training") + b"\x88", _str("other") + second, 1)
    path = make_archive(tmp_path / "a.pt", pkl, bytes(24))
    with pytest.raises(InputError, match="'other' is neither the 'tensor' buffer"):
        read_tensor_file(path)


def test_pickle_that_is_not_a_module(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "a.pt", pickle.dumps([1, 2], protocol=2))
    with pytest.raises(InputError, match="does not hold a scripted module"):
        read_tensor_file(path)


def test_garbage_pickle(tmp_path: Path) -> None:
    path = make_archive(tmp_path / "a.pt", b"\x80\x02(((")
    with pytest.raises(InputError, match="malformed data.pkl"):
        read_tensor_file(path)


# --- feature_keys.pt -------------------------------------------------------------------------

def test_feature_keys_saved_by_torch(tmp_path: Path) -> None:
    import torch

    torch.save(["user_id", "video_id"], tmp_path / "feature_keys.pt")
    assert read_feature_keys(tmp_path / "feature_keys.pt") == ["user_id", "video_id"]


def test_feature_keys_refuse_every_global(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = make_archive(tmp_path / "feature_keys.pt", _call_pickle("os", "system",
                                                                  f"touch {marker}"), None)
    with pytest.raises(InputError, match=r"feature_keys.pt: refuses pickle global os\.system"):
        read_feature_keys(path)
    assert not marker.exists()


@pytest.mark.parametrize("obj", [{"a": 1}, ["a", 1], "abc"])
def test_feature_keys_must_be_a_list_of_str(tmp_path: Path, obj: object) -> None:
    path = make_archive(tmp_path / "feature_keys.pt", pickle.dumps(obj, protocol=2), None)
    with pytest.raises(InputError, match="expected a list of str"):
        read_feature_keys(path)
