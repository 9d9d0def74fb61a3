"""`data prepare` in bounded memory: raw logs of any size -> the sequence store, via disk.

The rules are `prepare`'s (see its module docstring); the store is the same byte for byte. What
differs is where the events wait between reading and sorting:

1. Every log file is streamed in blocks (pyarrow's CSV reader). Each row becomes a 25-byte
   record (user's slot among the user_features users, time_ms, video_id, action bitmask); rows of
   users without features are dropped there. The records wait in memory while they fit one
   sorting group (a log of KuaiRand-1K size never touches the disk); from the first block that
   would pass that, they all go to the spill file of their user range instead. Which users each
   standard period holds and how many events each featured user has are counted on the way
   (memory: a few bytes per user, none per event).
2. The users kept are those in both periods; consecutive spill files are grouped so that a
   group's events fit the memory limit (records held in memory are one group), and each group is
   loaded, stably sorted by (user, time) and appended to the store's arrays. Records reach a spill
   file in file order (period 1's parts, period 2's, the random log), so the stable sort orders
   ties as the in-memory path does.

Everything is written into a hidden sibling of the store directory and renamed into place only
when complete; on any failure (a bad row, a full disk) that directory is removed, so no
half-written store is ever left looking like one.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from hstu_replay.data import schema
from hstu_replay.data.limits import DEFAULT_MEMORY_GB, group_events
from hstu_replay.data.prepare import EXPECTED, LOG_TYPES, UserContext, check_last_line, read_header, read_user_context
from hstu_replay.data.store import (
    ARRAYS,
    FORMAT_VERSION,
    META_FILE,
    DroppedUsers,
    SourceFile,
    StoreMeta,
    check_target,
    file_checksum,
    write_meta,
    write_npy_header,
)
from hstu_replay.errors import OutputError, RawDataError

#: CSV bytes parsed at a time; about 900k rows of a KuaiRand log.
BLOCK_BYTES = 64 << 20
#: User ranges (spill files) at most; fewer when there are fewer users.
SPILL_FILES = 256

RECORD = np.dtype([("slot", "<i8"), ("time", "<i8"), ("video", "<i8"), ("action", "u1")])
_ENOSPC = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass(frozen=True)
class RawFiles:
    """The files of one release found in a raw folder, in concatenation order."""

    release: schema.Release
    periods: tuple[tuple[Path, ...], tuple[Path, ...]]
    random_log: Path | None
    user_features: Path

    @property
    def logs(self) -> list[tuple[int | None, Path]]:
        """(standard period or None for the random log, path), in concatenation order."""
        out: list[tuple[int | None, Path]] = [(p, path) for p in (0, 1) for path in self.periods[p]]
        return out + ([(None, self.random_log)] if self.random_log else [])

    @property
    def all(self) -> list[Path]:
        return [path for _, path in self.logs] + [self.user_features]


def find_raw_files(raw: Path, include_random: bool) -> RawFiles:
    """The release whose user_features file `raw` holds, with every file it needs checked present."""
    if not raw.is_dir():
        raise RawDataError(f"{raw}: not a directory (expected a KuaiRand data folder)")
    found = [r for r in schema.RELEASES.values() if (raw / r.user_features).is_file()]
    if len(found) != 1:
        names = ", ".join(r.user_features for r in schema.RELEASES.values())
        what = "none" if not found else "more than one"
        raise RawDataError(f"{raw}: {what} of {names} found (one release per folder)")
    release = found[0]
    periods = tuple(tuple(release.period_files(raw, p)) for p in (0, 1))
    random_log = raw / release.random_log if include_random else None
    files = RawFiles(release, periods, random_log, raw / release.user_features)  # type: ignore[arg-type]
    for path in files.all:
        if not path.is_file():
            raise RawDataError(f"{path}: file not found (the {release.name} release's files are "
                               f"{', '.join(p.name for p in files.all)})")
    return files


def check_log_file(path: Path) -> list[str]:
    """A log's header is the published one in the published order and its last line is whole."""
    header = read_header(path)
    if tuple(header) != schema.LOG_COLUMNS:
        missing = [name for name in schema.LOG_COLUMNS if name not in header]
        if missing:
            raise RawDataError(f"{path}: header lacks column(s) {', '.join(missing)}")
        column = next(i for i, (a, b) in enumerate(zip(header, schema.LOG_COLUMNS)) if a != b)
        raise RawDataError(
            f"{path}: line 1: columns in another order (column {column + 1} is {header[column]!r}, "
            f"the published order has {schema.LOG_COLUMNS[column]!r}; part files must share it)"
        )
    check_last_line(path, header)
    return header


@dataclass
class _Tally:
    """What pass 1 counts: per featured slot, presence in each period and events kept."""

    present: np.ndarray  # bool[2, U]
    events: np.ndarray  # int64[U]
    unfeatured: list[np.ndarray]  # per period: sorted distinct ids without features
    time_min: int = np.iinfo(np.int64).max
    time_max: int = np.iinfo(np.int64).min


class _Slots:
    """user id -> slot among the featured users (sorted by id), or -1."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids
        small = ids.size and 0 <= ids[0] and ids[-1] < (1 << 22)
        self.table = None
        if small:
            self.table = np.full(int(ids[-1]) + 2, -1, np.int64)
            self.table[ids] = np.arange(ids.size)

    def __call__(self, users: np.ndarray) -> np.ndarray:
        if self.table is not None:
            return self.table[np.clip(users, -1, self.table.size - 1)]
        pos = np.minimum(np.searchsorted(self.ids, users), self.ids.size - 1)
        return np.where(self.ids[pos] == users, pos, -1)


def prepare_bounded(raw_dir: str | Path, out_dir: str | Path, include_random: bool = False,
                    memory_gb: float = DEFAULT_MEMORY_GB) -> StoreMeta:
    """Read a KuaiRand release's raw files in `raw_dir`; write the store to `out_dir`."""
    raw, out = Path(raw_dir), Path(out_dir)
    events_per_group = group_events(memory_gb)
    files = find_raw_files(raw, include_random)
    for _, path in files.logs:
        check_log_file(path)
    context = read_user_context(files.user_features)
    check_target(out)
    work = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        work.mkdir(parents=True)
        meta = _build(files, context, work, events_per_group, include_random)
        _publish(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return meta


def _build(files: RawFiles, context: UserContext, work: Path, group_events: int,
           include_random: bool) -> StoreMeta:
    by_id = np.argsort(context.user_ids, kind="stable")
    featured = context.user_ids[by_id]
    users = featured.size
    ranges = min(SPILL_FILES, max(1, users))
    range_of_slot = (np.arange(users) * ranges // max(1, users)).astype(np.uint16)
    tally = _Tally(np.zeros((2, users), bool), np.zeros(users, np.int64),
                   [np.zeros(0, np.int64), np.zeros(0, np.int64)])
    slots = _Slots(featured)
    spill = _Spill(work / "spill", range_of_slot, ranges, group_events)
    with spill:
        for period, path in files.logs:
            for batch in _blocks(path):
                _records(batch, period, slots, spill, tally)

    both = tally.present[0] & tally.present[1]
    unfeatured_both = np.intersect1d(*tally.unfeatured, assume_unique=True).size
    in1 = int(tally.present[0].sum()) + tally.unfeatured[0].size
    in2 = int(tally.present[1].sum()) + tally.unfeatured[1].size
    in_both = int(both.sum()) + unfeatured_both
    dropped = DroppedUsers(one_period_only=in1 + in2 - 2 * in_both, no_user_features=unfeatured_both)
    kept = np.flatnonzero(both)
    if kept.size == 0:
        raise RawDataError(
            "no user is in both standard logs and in user_features "
            f"({in1} and {in2} users in the logs, {users} featured)"
        )
    counts = tally.events[kept]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    events = int(offsets[-1])
    small = {
        "user_ids": featured[kept].astype(np.int64),
        "offsets": offsets,
        "context": context.codes[by_id][kept],
    }
    with _Files([work / f"{name}.npy" for name in small]) as sinks:
        for sink, (name, array) in zip(sinks, small.items()):
            write_npy_header(sink, ARRAYS[name][0], array.shape)
            sink.write(np.ascontiguousarray(array, ARRAYS[name][0]).data)
    keep = np.zeros(users, bool)
    keep[kept] = True
    written = _sort_groups(spill, tally, keep, work, events)
    if written != events:
        raise AssertionError(f"wrote {written} events, counted {events}")
    shutil.rmtree(spill.directory, ignore_errors=True)
    meta = StoreMeta(
        format_version=FORMAT_VERSION,
        users=int(kept.size),
        events=events,
        dropped=dropped,
        include_random=include_random,
        sources=tuple(SourceFile(p.name, p.stat().st_size) for p in files.all),
        checksum=file_checksum(work),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    with _disk_errors(work / META_FILE):
        write_meta(work, meta)
    return meta


def _blocks(path: Path) -> Iterator[pa.Table]:
    """The columns `prepare` uses, piece by piece (BLOCK_BYTES of whole lines, each parsed by
    pyarrow's multithreaded reader); a bad row -> one line naming it."""
    convert = pacsv.ConvertOptions(column_types=LOG_TYPES, include_columns=list(LOG_TYPES))
    options = pacsv.ReadOptions(column_names=list(schema.LOG_COLUMNS))
    line = 2
    with open(path, "rb") as f:
        f.readline()  # the header, checked before
        while data := f.read(BLOCK_BYTES):
            if not data.endswith(b"\n"):
                data += f.readline()
            try:
                table = pacsv.read_csv(pa.py_buffer(data), options, convert_options=convert)
            except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
                raise _bad_row(path, line, exc) from None
            del data
            for name in LOG_TYPES:
                column = table.column(name)
                if column.null_count:
                    row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
                    raise RawDataError(
                        f"{path}: line {line + row}, column {schema.LOG_COLUMNS.index(name) + 1} "
                        f"({name}): empty value (expected {EXPECTED[str(LOG_TYPES[name])]})"
                    )
            yield table
            line += table.num_rows


def _bad_row(path: Path, line: int, exc: Exception) -> RawDataError:
    """Find the row at or after `line` that the parser refused (lines are read from there on)."""
    widths = {name: 8 if name in schema.ACTION_COLUMNS else 64 for name in schema.LOG_COLUMNS}
    with open(path, "rb") as f:
        for _ in range(line - 1):
            f.readline()
        for number, row in enumerate(iter(f.readline, b""), start=line):
            fields = row.rstrip(b"\r\n").split(b",")
            if len(fields) != len(schema.LOG_COLUMNS):
                return RawDataError(f"{path}: line {number}: expected {len(schema.LOG_COLUMNS)} "
                                    f"columns, got {len(fields)} (truncated or malformed row)")
            for i, (name, field) in enumerate(zip(schema.LOG_COLUMNS, fields)):
                if name not in LOG_TYPES:
                    continue
                try:
                    value = int(field)
                except ValueError:
                    value = None
                bits = widths[name]
                if value is None or not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
                    shown = field[:40].decode(errors="replace")
                    return RawDataError(f"{path}: line {number}, column {i + 1} ({name}): invalid "
                                        f"value {shown!r} (expected {EXPECTED[str(LOG_TYPES[name])]})")
    message = str(exc).splitlines()[0] if str(exc) else "unreadable"
    return RawDataError(f"{path}: after line {line}: {message}")


def _records(batch: pa.Table, period: int | None, slots: _Slots, spill: _Spill, tally: _Tally) -> None:
    """A block's rows of featured users as records, counted and handed to `spill`."""
    users = batch.column("user_id").to_numpy()
    if users.size == 0:
        return
    slot = slots(users)
    featured = slot >= 0
    if period is not None:
        tally.present[period, slot[featured]] = True
        if not featured.all():
            others = np.unique(users[~featured])
            tally.unfeatured[period] = np.union1d(tally.unfeatured[period], others)
    times = batch.column("time_ms").to_numpy()
    tally.time_min = min(tally.time_min, int(times.min()))
    tally.time_max = max(tally.time_max, int(times.max()))
    records = np.empty(int(featured.sum()), RECORD)
    records["slot"] = slot[featured]
    records["time"] = times[featured]
    records["video"] = batch.column("video_id").to_numpy()[featured]
    actions = np.zeros(users.size, np.uint8)
    for name, weight in zip(schema.ACTION_COLUMNS, schema.ACTION_WEIGHTS):
        actions |= (batch.column(name).to_numpy() != 0).view(np.uint8) * np.uint8(weight)
    records["action"] = actions[featured]
    tally.events += np.bincount(records["slot"], minlength=tally.events.size)
    spill.add(records)


class _Spill:
    """Pass 1's records, in file order, until pass 2 sorts them: held in memory while they fit one
    sorting group; from the first block that would pass it, in one file per user range (the
    records held so far first, in order). `groups` gives them back a sorting group at a time."""

    def __init__(self, directory: Path, range_of_slot: np.ndarray, ranges: int, group_events: int):
        self.directory, self.range_of_slot, self.group_events = directory, range_of_slot, group_events
        self.paths = [directory / f"{i:04d}.bin" for i in range(ranges)]
        # one group's room, reserved, not touched: only the pages records fill become resident
        self.held: np.ndarray | None = np.empty(group_events, RECORD)  # None once on disk
        self.blocks = [0]  # where each held block starts (and the end of the last)
        self.count = 0
        self.sinks: list = []
        self.open = ExitStack()  # the spill files, while pass 1 writes them

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open.__exit__(*exc)

    def add(self, records: np.ndarray) -> None:
        if self.held is not None and self.count + records.size <= self.group_events:
            self.held[self.count : self.count + records.size] = records
            self.count += records.size
            self.blocks.append(self.count)
            return
        if self.held is not None:
            self.directory.mkdir()
            self.sinks = self.open.enter_context(_Files(self.paths))
            for start, stop in zip(self.blocks, self.blocks[1:]):  # block by block: each in its own order
                self._write(self.held[start:stop])
            self.held = None
        self.count += records.size
        self._write(records)

    def _write(self, records: np.ndarray) -> None:
        where = self.range_of_slot[records["slot"]]
        if not np.all(where[1:] >= where[:-1]):  # a log in user order (KuaiRand's is) needs no reordering
            order = np.argsort(where, kind="stable")
            where, records = where[order], records[order]
        bounds = np.searchsorted(where, np.arange(len(self.sinks) + 1))
        for i in np.flatnonzero(np.diff(bounds)):
            self.sinks[i].write(records[bounds[i] : bounds[i + 1]].data)

    def groups(self, per_range: np.ndarray) -> Iterator[np.ndarray]:
        """The records a group at a time: consecutive ranges up to `group_events` events (`per_range`:
        each range's), each file read into one array and deleted; or all that memory held."""
        if self.held is not None:
            held, self.held = self.held[: self.count], np.empty(0, RECORD)
            yield held
            return
        start = 0
        while start < len(self.paths):
            stop, total = start + 1, int(per_range[start])
            while stop < len(self.paths) and total + per_range[stop] <= self.group_events:
                total += int(per_range[stop])
                stop += 1
            records, at = np.empty(total, RECORD), 0
            for path, size in zip(self.paths[start:stop], per_range[start:stop]):
                with open(path, "rb") as f:
                    got = f.readinto(records[at : at + size].view(np.uint8))
                if got != size * RECORD.itemsize:
                    raise AssertionError(f"{path}: {got} bytes, counted {size * RECORD.itemsize}")
                path.unlink()
                at += int(size)
            yield records
            del records  # before the next group is loaded
            start = stop


def _sort_groups(spill: _Spill, tally: _Tally, keep: np.ndarray, work: Path, events: int) -> int:
    """Each group of the spill sorted by (user, time), the kept users' events appended; events written."""
    per_range = np.bincount(spill.range_of_slot, weights=tally.events, minlength=len(spill.paths)).astype(np.int64)
    span_bits = max(0, tally.time_max - tally.time_min).bit_length()
    outputs = {"video_ids": "video", "actions": "action", "times_ms": "time"}
    paths = {name: work / f"{name}.npy" for name in outputs}
    written = 0
    with _Files(list(paths.values())) as sinks:
        for sink, name in zip(sinks, outputs):
            write_npy_header(sink, ARRAYS[name][0], (events,))
        for records in spill.groups(per_range):
            order = _kept_order(records, keep, span_bits, tally.time_min)
            for sink, name in zip(sinks, outputs):
                column = np.ascontiguousarray(records[outputs[name]][order], ARRAYS[name][0])
                sink.write(column.data)
                del column
            written += order.size
            del records, order
    return written


def _kept_order(records: np.ndarray, keep: np.ndarray, span_bits: int, time_min: int) -> np.ndarray:
    """The positions of the records of kept users, stably sorted by (slot, time). With narrow
    enough slots and times, one int64 key (slot, then time, in its bits) is sorted; a record of a
    user not kept gets the largest key, so it sorts last and is cut off."""
    slots, times = records["slot"], records["time"]
    kept = keep[slots]
    n = int(np.count_nonzero(kept))
    if n == 0:
        return np.zeros(0, np.int64)
    first = int(slots.min())
    if span_bits + max(1, int(slots.max()) - first).bit_length() > 62:
        mine = np.flatnonzero(kept)
        return mine[np.lexsort((times[mine], slots[mine] - first))]
    key = slots - first
    key <<= span_bits
    key |= times - time_min
    if n < records.size:
        key[~kept] = np.iinfo(np.int64).max
    del kept
    return np.argsort(key, kind="stable")[:n]


class _Files:
    """Binary files opened for writing together; a full disk -> one OutputError naming the file."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.files: list = []

    def __enter__(self) -> list:
        self.files = [_Sink(p) for p in self.paths]
        return self.files

    def __exit__(self, *exc: object) -> None:
        problem = None
        for f in self.files:
            try:
                f.close()
            except OutputError as error:
                problem = problem or error
        if problem and exc[0] is None:
            raise problem


class _Sink:
    """A file opened for writing whose ENOSPC/EDQUOT/EFBIG becomes a one-line OutputError."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")

    def write(self, data) -> None:
        with _disk_errors(self.path):
            self.file.write(data)

    def close(self) -> None:
        with _disk_errors(self.path):
            self.file.close()


@contextmanager
def _disk_errors(path: Path):
    try:
        yield
    except OSError as exc:
        if exc.errno in _ENOSPC:
            raise OutputError(f"{path}: {os.strerror(exc.errno).lower()} while writing the store "
                              f"(nothing was published)") from None
        raise


def _publish(work: Path, out: Path) -> None:
    """Rename the finished store into place; a store `out` held before is replaced."""
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(work, out)
    shutil.rmtree(old, ignore_errors=True)

