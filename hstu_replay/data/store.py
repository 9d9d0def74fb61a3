"""The compact sequence store: one directory of .npy arrays plus meta.json, opened memory-mapped.

Layout (U users ascending by id, N events; user i's events are [offsets[i], offsets[i+1])):

    meta.json        format, version, counts, dropped users, source files, sha256, created
    user_ids.npy     int64[U]      strictly increasing
    offsets.npy      int64[U+1]    offsets[0] == 0, offsets[U] == N, non-decreasing
    video_ids.npy    int64[N]
    actions.npy      uint8[N]      action bitmask (interface.ACTION_BITS)
    times_ms.npy     int64[N]      non-decreasing within a user
    context.npy      int64[U, 5]   contextual codes in CONTEXT_KEYS order

Opening maps the arrays (np.load(mmap_mode='r')) and checks only what is O(U), so it takes
milliseconds whatever N is; `verify()` rereads everything against the checksum.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from hstu_replay.errors import ConfigError, InputError, opened_by_option

FORMAT = "hstu-replay-sequence-store"
FORMAT_VERSION = 1
META_FILE = "meta.json"

#: name -> (dtype, number of dimensions), in checksum order.
ARRAYS: dict[str, tuple[np.dtype, int]] = {
    "user_ids": (np.dtype("<i8"), 1),
    "offsets": (np.dtype("<i8"), 1),
    "video_ids": (np.dtype("<i8"), 1),
    "actions": (np.dtype("u1"), 1),
    "times_ms": (np.dtype("<i8"), 1),
    "context": (np.dtype("<i8"), 2),
}
CONTEXT_WIDTH = 5
_HASH_CHUNK = 1 << 24  # bytes per hashlib update


@dataclass(frozen=True)
class SourceFile:
    name: str
    size: int


@dataclass(frozen=True)
class DroppedUsers:
    """Users of the logs that are not in the store, by reason."""

    one_period_only: int = 0  # in one standard log only (NVIDIA's inner join)
    no_user_features: int = 0  # in both logs but without a user_features row

    @property
    def total(self) -> int:
        return self.one_period_only + self.no_user_features


@dataclass(frozen=True)
class StoreMeta:
    """meta.json, typed."""

    format_version: int
    users: int
    events: int
    dropped: DroppedUsers
    include_random: bool
    sources: tuple[SourceFile, ...]
    checksum: str  # "sha256:<hex>" over the arrays (see `checksum`)
    created: str  # ISO 8601, UTC

    def to_json(self) -> dict:
        out = {"format": FORMAT, **asdict(self)}
        out["sources"] = [asdict(s) for s in self.sources]
        return out

    @classmethod
    def from_json(cls, data: dict, where: Path) -> StoreMeta:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{where}: not a {FORMAT} meta file")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise InputError(
                f"{where}: store format version {version!r}, this tool reads {FORMAT_VERSION}"
            )
        try:
            return cls(
                format_version=int(version),
                users=int(data["users"]),
                events=int(data["events"]),
                dropped=DroppedUsers(**data["dropped"]),
                include_random=bool(data["include_random"]),
                sources=tuple(SourceFile(str(s["name"]), int(s["size"])) for s in data["sources"]),
                checksum=str(data["checksum"]),
                created=str(data["created"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: malformed meta ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True, eq=False)
class UserHistory:
    """One user's sequence; the arrays are read-only slices of the store's memory maps."""

    user_id: int
    context: tuple[int, ...]  # 5 codes, CONTEXT_KEYS order
    video_ids: np.ndarray
    actions: np.ndarray
    times_ms: np.ndarray

    def __len__(self) -> int:
        return len(self.video_ids)


def checksum(arrays: dict[str, np.ndarray]) -> str:
    """sha256 over each array's name, dtype, shape and bytes, in ARRAYS order, chunk by chunk."""
    h = hashlib.sha256()
    for name in ARRAYS:
        array = arrays[name]
        h.update(f"{name}:{array.dtype.str}:{list(array.shape)}\n".encode())
        flat = array.reshape(-1)
        step = max(1, _HASH_CHUNK // max(1, array.itemsize))
        for start in range(0, flat.size, step):
            h.update(np.ascontiguousarray(flat[start : start + step]).data)
    return "sha256:" + h.hexdigest()


def file_checksum(root: Path) -> str:
    """`checksum` of the arrays as written in `root`, read through a buffer, not a memory map
    (so hashing a store larger than memory leaves nothing resident)."""
    h = hashlib.sha256()
    buffer = bytearray(_HASH_CHUNK)
    for name in ARRAYS:
        with open(root / f"{name}.npy", "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            if fortran:
                raise InputError(f"{root / name}.npy: Fortran-ordered array")
            h.update(f"{name}:{dtype.str}:{list(shape)}\n".encode())
            view = memoryview(buffer)
            while n := f.readinto(buffer):
                h.update(view[:n])
    return "sha256:" + h.hexdigest()


def write_npy_header(f, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """The header `np.save` writes for an array of `dtype` and `shape` (the data follows)."""
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )


def write_meta(root: Path, meta: StoreMeta) -> None:
    """meta.json, written last: a directory without it is not a store."""
    tmp = root / f"{META_FILE}.tmp"
    tmp.write_text(json.dumps(meta.to_json(), indent=2) + "\n")
    os.replace(tmp, root / META_FILE)


def check_target(out: Path) -> None:
    """`out` may be new, an empty directory or a store (to be replaced); anything else is refused."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory")
    if not out.exists():
        return
    ours = {META_FILE, *(f"{name}.npy" for name in ARRAYS)}
    foreign = [p.name for p in out.iterdir() if p.name not in ours and not p.name.endswith(".tmp")]
    if foreign:
        raise ConfigError(
            f"{out}: not empty and not a sequence store (holds {foreign[0]}); choose another --out"
        )


def write_store(
    out_dir: str | Path,
    *,
    user_ids: np.ndarray,
    offsets: np.ndarray,
    video_ids: np.ndarray,
    actions: np.ndarray,
    times_ms: np.ndarray,
    context: np.ndarray,
    sources: tuple[SourceFile, ...] = (),
    dropped: DroppedUsers = DroppedUsers(),
    include_random: bool = False,
) -> StoreMeta:
    """Write a store; meta.json goes last, so a store without it is an unfinished one.

    `out_dir` may be new, empty or an existing store (replaced); anything else is refused.
    """
    out = Path(out_dir)
    arrays = {
        name: np.ascontiguousarray(value, dtype=ARRAYS[name][0])
        for name, value in (
            ("user_ids", user_ids),
            ("offsets", offsets),
            ("video_ids", video_ids),
            ("actions", actions),
            ("times_ms", times_ms),
            ("context", context),
        )
    }
    problem = _shape_problem(arrays, len(arrays["user_ids"]), len(arrays["video_ids"]))
    if problem:
        raise ValueError(f"write_store: {problem}")
    _claim(out)
    meta = StoreMeta(
        format_version=FORMAT_VERSION,
        users=len(arrays["user_ids"]),
        events=len(arrays["video_ids"]),
        dropped=dropped,
        include_random=include_random,
        sources=tuple(sources),
        checksum=checksum(arrays),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    for name, array in arrays.items():
        tmp = out / f"{name}.npy.tmp"
        with open(tmp, "wb") as f:
            np.save(f, array, allow_pickle=False)
        os.replace(tmp, out / f"{name}.npy")
    write_meta(out, meta)
    return meta


def _claim(out: Path) -> None:
    """Make `out` ready for a new store: create it, or unpublish the store it holds."""
    check_target(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)


def _shape_problem(arrays: dict[str, np.ndarray], users: int, events: int) -> str | None:
    expected = {
        "user_ids": (users,),
        "offsets": (users + 1,),
        "video_ids": (events,),
        "actions": (events,),
        "times_ms": (events,),
        "context": (users, CONTEXT_WIDTH),
    }
    for name, shape in expected.items():
        array = arrays[name]
        if array.dtype != ARRAYS[name][0]:
            return f"{name}.npy has dtype {array.dtype}, expected {ARRAYS[name][0]}"
        if array.shape != shape:
            return f"{name}.npy has shape {array.shape}, expected {shape}"
    offsets = arrays["offsets"]
    if offsets[0] != 0 or offsets[-1] != events or np.any(np.diff(offsets) < 0):
        return "offsets are not a non-decreasing run from 0 to the number of events"
    if users > 1 and np.any(np.diff(arrays["user_ids"]) <= 0):
        return "user_ids are not strictly increasing"
    return None


class SequenceStore:
    """A prepared store, memory-mapped: `user(i)` slices without copying."""

    def __init__(self, path: Path, meta: StoreMeta, arrays: dict[str, np.ndarray]):
        self.path = path
        self.meta = meta
        self._arrays = arrays
        self._offsets = arrays["offsets"]
        self._context = arrays["context"]

    @classmethod
    def open(cls, path: str | Path) -> SequenceStore:
        """Map a store; a missing, foreign, truncated or inconsistent one -> InputError."""
        root = Path(path)
        meta_path = root / META_FILE
        if not root.is_dir():
            raise InputError(f"{root}: no such store directory")
        if not meta_path.is_file():
            raise InputError(f"{root}: not a sequence store ({META_FILE} missing)")
        try:
            data = json.loads(meta_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"{meta_path}: unreadable ({type(exc).__name__})") from None
        meta = StoreMeta.from_json(data, meta_path)
        arrays = {}
        for name in ARRAYS:
            file = root / f"{name}.npy"
            try:
                arrays[name] = np.load(file, mmap_mode="r", allow_pickle=False)
            except FileNotFoundError:
                raise InputError(f"{file}: missing from the store") from None
            except (OSError, ValueError) as exc:
                raise InputError(f"{file}: corrupt or truncated ({exc})") from None
        problem = _shape_problem(arrays, meta.users, meta.events)
        if problem:
            raise InputError(f"{root}: {problem}")
        return cls(root, meta, arrays)

    @property
    def num_users(self) -> int:
        return self.meta.users

    @property
    def num_events(self) -> int:
        return self.meta.events

    @property
    def user_ids(self) -> np.ndarray:
        return self._arrays["user_ids"]

    @property
    def offsets(self) -> np.ndarray:
        return self._offsets

    @property
    def video_ids(self) -> np.ndarray:
        return self._arrays["video_ids"]

    @property
    def actions(self) -> np.ndarray:
        return self._arrays["actions"]

    @property
    def times_ms(self) -> np.ndarray:
        return self._arrays["times_ms"]

    @property
    def context(self) -> np.ndarray:
        return self._context

    @property
    def nbytes(self) -> int:
        """Bytes of the store's array files on disk."""
        return sum((self.path / f"{name}.npy").stat().st_size for name in ARRAYS)

    def __len__(self) -> int:
        return self.meta.users

    def __iter__(self):
        return (self.user(i) for i in range(len(self)))

    def user(self, index: int) -> UserHistory:
        """The `index`-th user (ascending user id); negative indexes count from the end."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"user index {index} out of range 0..{len(self) - 1}")
        index %= len(self)
        lo, hi = int(self._offsets[index]), int(self._offsets[index + 1])
        return UserHistory(
            user_id=int(self.user_ids[index]),
            context=tuple(int(c) for c in self._context[index]),
            video_ids=self.video_ids[lo:hi],
            actions=self.actions[lo:hi],
            times_ms=self.times_ms[lo:hi],
        )

    def index_of(self, user_id: int) -> int:
        """Position of `user_id`; KeyError if the store does not hold it."""
        i = int(np.searchsorted(self.user_ids, user_id))
        if i < len(self) and int(self.user_ids[i]) == user_id:
            return i
        raise KeyError(user_id)

    def verify(self) -> None:
        """Reread every array against meta's checksum; InputError on any difference."""
        actual = file_checksum(self.path)
        if actual != self.meta.checksum:
            raise InputError(
                f"{self.path}: checksum mismatch (meta {self.meta.checksum[:19]}..., "
                f"arrays {actual[:19]}...): the store is corrupt"
            )


def open_store(path: str | Path | None, flag: str = "--store") -> SequenceStore:
    """The store an option names; a missing or corrupt one is one ConfigError line naming the option."""
    return opened_by_option(flag, path, SequenceStore.open)
