"""Read the tensor out of a TorchScript archive without torch and without running its code.

A dump file is a zip: `<prefix>/data.pkl` (a protocol-2 pickle of the scripted module) plus
`<prefix>/data/<key>` (raw little-endian storage bytes). A pickle can call any importable
function, so `data.pkl` is parsed by an unpickler that admits exactly the four kinds of global
torch.jit.save writes, maps them to inert stand-ins, and refuses everything else. Tensors are
rebuilt with numpy after checking every size, offset and stride against the storage bytes.
"""

from __future__ import annotations

import collections
import io
import pickle
import re
import zipfile
import zlib
from pathlib import Path
from typing import Any, NoReturn, cast

import numpy as np

from hstu_replay.errors import InputError

#: Largest zip member or rebuilt tensor we read (bytes); read at call time, so it can be raised
#: (or patched in tests) here if dumps ever need more.
MAX_MEMBER_BYTES = 2 << 30
#: Largest `data.pkl` we parse; a module with one buffer pickles to a few hundred bytes.
MAX_PICKLE_BYTES = 16 << 20
_MAX_DIMS = 32

#: torch storage class -> little-endian numpy dtype of its bytes (BFloat16 is upcast later).
STORAGE_DTYPES: dict[str, str] = {
    "LongStorage": "<i8",
    "IntStorage": "<i4",
    "ShortStorage": "<i2",
    "CharStorage": "i1",
    "ByteStorage": "u1",
    "BoolStorage": "?",
    "FloatStorage": "<f4",
    "DoubleStorage": "<f8",
    "HalfStorage": "<f2",
    "BFloat16Storage": "<u2",
}
_KEY = re.compile(r"[A-Za-z0-9_]{1,64}")


class _Refused(Exception):
    """Internal: a reason to reject the file; turned into an InputError naming the file."""


def _refuse(message: str) -> NoReturn:
    raise _Refused(message)


class _Inert:
    """Base of the stand-ins: pickle's BUILD opcode may not mutate them."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        _refuse(f"pickle tries to set state on a {type(self).__name__[1:]}")


class _StorageType(_Inert):
    """Stand-in for a `torch.<X>Storage` class: only a dtype tag, not callable."""

    __slots__ = ("name", "bfloat16", "dtype")

    def __init__(self, name: str) -> None:
        self.name = name
        self.bfloat16 = name == "BFloat16Storage"
        self.dtype = np.dtype(STORAGE_DTYPES[name])


class _Storage(_Inert):
    """One storage's bytes, viewed (zero copy) as a flat numpy array."""

    __slots__ = ("kind", "key", "flat")

    def __init__(self, kind: _StorageType, key: str, flat: np.ndarray) -> None:
        self.kind, self.key, self.flat = kind, key, flat


class _Tensor(_Inert):
    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array


class _Module:
    """Stand-in for the scripted module class (`__torch__.*`): it only records its state."""

    __slots__ = ("state",)

    def __new__(cls, *args: object, **kwargs: object) -> _Module:
        obj = super().__new__(cls)
        obj.state = None
        return obj

    def __setstate__(self, state: object) -> None:
        if self.state is not None:
            _refuse("pickle sets a module's state twice")
        self.state = state


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rebuild_tensor(storage: object, offset: object, size: object, stride: object,
                    _requires_grad: object, _backward_hooks: object,
                    _metadata: object = None) -> _Tensor:
    """Our `torch._utils._rebuild_tensor_v2`: a strided view of the storage, copied to C order.

    Called positionally by pickle's REDUCE with 6 or 7 arguments; the last three do not matter
    for a plain buffer and are ignored.
    """
    if not isinstance(storage, _Storage):
        _refuse("tensor rebuilt from something that is not a storage")
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
            and len(size) <= _MAX_DIMS and all(map(_is_int, (offset, *size, *stride)))):
        _refuse(f"tensor on storage {storage.key} has malformed offset/size/stride")
    offset = cast(int, offset)
    if offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride):
        _refuse(f"tensor on storage {storage.key} has a negative offset, size or stride")
    kind, flat = storage.kind, storage.flat
    numel = 1
    for n in size:
        numel *= n
    if numel * flat.itemsize > MAX_MEMBER_BYTES:
        _refuse(f"tensor on storage {storage.key} exceeds {MAX_MEMBER_BYTES} bytes")
    if numel == 0:
        if offset > flat.size:
            _refuse(f"tensor offset {offset} is past the end of storage {storage.key}")
        out = np.empty(size, dtype=flat.dtype)
    else:
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= flat.size:
            _refuse(f"tensor reaches element {last} of storage {storage.key} "
                    f"which holds {flat.size}")
        view = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=size, strides=[s * flat.itemsize for s in stride],
            writeable=False)
        out = np.array(view, order="C", copy=True)
    if kind.bfloat16:  # bf16 is the top half of a float32: widening is exact
        out = (out.astype(np.uint32) << 16).view(np.float32)
    elif out.dtype == np.bool_:  # a byte other than 0/1 would make a non-canonical numpy bool
        out = out.view(np.uint8) != 0
    return _Tensor(out.astype(out.dtype.newbyteorder("="), copy=False))


class _ArchiveUnpickler(pickle.Unpickler):
    """Admits only what torch.jit.save writes for a module with buffers."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive, self._prefix = archive, prefix
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        if module == "__torch__" or module.startswith("__torch__."):
            return _Module
        _refuse(f"refuses pickle global {module}.{name}"[:200])

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            _refuse("unexpected persistent id in data.pkl")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or not _is_int(numel):
            _refuse("malformed storage reference in data.pkl")
        if not _KEY.fullmatch(key) or numel < 0:
            _refuse(f"bad storage key or size {key!r}"[:200])
        if key in self._storages:
            if self._storages[key].kind.name != kind.name or self._storages[key].flat.size != numel:
                _refuse(f"storage {key} is referenced with two different types or sizes")
            return self._storages[key]
        raw = _read_member(self._archive, f"{self._prefix}/data/{key}", MAX_MEMBER_BYTES)
        if len(raw) != numel * kind.dtype.itemsize:
            _refuse(f"storage {key} holds {len(raw)} bytes but declares {numel} "
                    f"x {kind.dtype.itemsize}-byte elements")
        storage = _Storage(kind, key, np.frombuffer(raw, dtype=kind.dtype))
        self._storages[key] = storage
        return storage


class _PlainUnpickler(pickle.Unpickler):
    """For `feature_keys.pt`: no globals and no storages at all (a list of str needs neither)."""

    def find_class(self, module: str, name: str) -> Any:
        _refuse(f"refuses pickle global {module}.{name}"[:200])

    def persistent_load(self, pid: Any) -> Any:
        _refuse("unexpected persistent id in data.pkl")


def _read_member(archive: zipfile.ZipFile, name: str, limit: int) -> bytes:
    try:
        info = archive.getinfo(name)
    except KeyError:
        _refuse(f"missing archive member {name}")
    if info.file_size > limit:
        _refuse(f"archive member {name} is {info.file_size} bytes, over the {limit}-byte limit")
    data = archive.read(info)
    if len(data) != info.file_size:
        _refuse(f"archive member {name} is truncated")
    return data


def _find_prefix(archive: zipfile.ZipFile) -> str:
    """The archive's top folder: the one holding `data.pkl` (torch names it after the file)."""
    prefixes = [n[: -len("/data.pkl")] for n in archive.namelist()
                if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(prefixes) != 1:
        _refuse("not a torch archive (expected exactly one <name>/data.pkl, "
                f"found {len(prefixes)})")
    prefix = prefixes[0]
    if f"{prefix}/byteorder" in archive.namelist():
        order = _read_member(archive, f"{prefix}/byteorder", 64).strip()
        if order != b"little":
            _refuse(f"unsupported byte order {order[:16]!r}")
    return prefix


def _unpickle(path: str | Path, make: Any) -> Any:
    """Open the zip at `path`, unpickle its data.pkl with `make(data, archive, prefix)`."""
    try:
        with zipfile.ZipFile(path) as archive:
            prefix = _find_prefix(archive)
            data = _read_member(archive, f"{prefix}/data.pkl", MAX_PICKLE_BYTES)
            try:
                return make(data, archive, prefix).load()
            except (_Refused, zipfile.BadZipFile, OSError, zlib.error):
                raise  # our own refusals and unreadable storages keep their message
            except Exception as exc:  # any malformed pickle: a one-line refusal, no traceback
                _refuse(f"malformed data.pkl ({type(exc).__name__}: {exc})"[:300])
    except _Refused as exc:
        raise InputError(_one_line(f"{path}: {exc}")) from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
            ValueError, NotImplementedError, RuntimeError) as exc:  # truncated, odd compression
        raise InputError(_one_line(f"{path}: not a readable zip archive ({exc})")) from None


def _one_line(message: str) -> str:
    return " ".join(message.split())


def read_tensor_file(path: str | Path) -> np.ndarray:
    """The `tensor` buffer of the scripted module saved at `path`, as a C-contiguous array."""
    root = _unpickle(path, _ArchiveUnpickler)
    if not isinstance(root, _Module) or not isinstance(root.state, dict):
        raise InputError(f"{path}: data.pkl does not hold a scripted module's state")
    for key, value in root.state.items():
        if key == "tensor" and isinstance(value, _Tensor):
            continue
        if not isinstance(value, (bool, int, float, str, type(None))):
            raise InputError(_one_line(f"{path}: module attribute {str(key)[:60]!r} is "
                                       "neither the 'tensor' buffer nor a plain value"))
    tensor = root.state.get("tensor")
    if not isinstance(tensor, _Tensor):
        raise InputError(f"{path}: module has no buffer named 'tensor'")
    return tensor.array


def read_feature_keys(path: str | Path) -> list[str]:
    """`feature_keys.pt` (a torch.save'd list of str), parsed admitting nothing but that."""
    keys = _unpickle(path, lambda data, _archive, _prefix: _PlainUnpickler(io.BytesIO(data)))
    if not isinstance(keys, list):
        raise InputError(f"{path}: expected a list of str, got {type(keys).__name__}")
    if not all(isinstance(k, str) for k in keys):
        raise InputError(f"{path}: expected a list of str, found a non-str item")
    return keys
