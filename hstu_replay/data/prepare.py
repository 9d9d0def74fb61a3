"""KuaiRand-1K raw logs -> per-user sequences, the way NVIDIA's HSTU preprocessing builds them.

Per user: the events of the first standard log, then the second's (then, optionally, the random
log's), stably sorted by time_ms, so that events with equal time_ms keep that file order. Only
users present in both standard logs are kept (NVIDIA's inner join) and, of those, only users with
a user_features row (NVIDIA merges the features in with an inner join too); the dropped users are
counted in the store's meta. Action bitmask and the 1..k re-coding of the contextual features as
in the reference (shared/reference/kuairand-1k.md).

Vectorized: pyarrow converts only the columns used, the join is a lookup table from user id to
slot (searchsorted for ids too large for a table), and one stable sort over a packed
(user slot, time) key orders every event at once.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hstu_replay.data import schema
from hstu_replay.data.store import DroppedUsers, SourceFile, StoreMeta, write_store
from hstu_replay.errors import RawDataError


@dataclass(frozen=True)
class LogEvents:
    """One log file's events in file order."""

    user_ids: np.ndarray  # int64
    video_ids: np.ndarray  # int64
    times_ms: np.ndarray  # int64
    actions: np.ndarray  # uint8 bitmask

    def __len__(self) -> int:
        return len(self.user_ids)


@dataclass(frozen=True)
class UserContext:
    """user_features rows: user ids in file order and their contextual codes (1..k)."""

    user_ids: np.ndarray  # int64[U]
    codes: np.ndarray  # int64[U, 5], columns in CONTEXT_KEYS order


@dataclass(frozen=True)
class Sequences:
    """Every kept user's sequence, users ascending, concatenated (the store's arrays)."""

    user_ids: np.ndarray
    offsets: np.ndarray
    video_ids: np.ndarray
    actions: np.ndarray
    times_ms: np.ndarray
    context: np.ndarray
    dropped: DroppedUsers


def prepare(raw_dir: str | Path, out_dir: str | Path, include_random: bool = False) -> StoreMeta:
    """Read the raw KuaiRand-1K files in `raw_dir` and write a sequence store to `out_dir`."""
    raw = Path(raw_dir)
    if not raw.is_dir():
        raise RawDataError(f"{raw}: not a directory (expected the KuaiRand-1K data folder)")
    names = [*schema.STANDARD_LOGS, *([schema.LOG_RANDOM] if include_random else [])]
    names.append(schema.USER_FEATURES)
    paths = [raw / name for name in names]
    for path in paths:
        if not path.is_file():
            raise RawDataError(f"{path}: file not found (expected {', '.join(names)} in {raw})")
    period1, period2 = read_log(paths[0]), read_log(paths[1])
    extra = read_log(paths[2]) if include_random else None
    context = read_user_context(paths[-1])
    sequences = build_sequences(period1, period2, context, extra)
    sources = tuple(SourceFile(p.name, p.stat().st_size) for p in paths)
    return write_store(
        out_dir,
        user_ids=sequences.user_ids,
        offsets=sequences.offsets,
        video_ids=sequences.video_ids,
        actions=sequences.actions,
        times_ms=sequences.times_ms,
        context=sequences.context,
        sources=sources,
        dropped=sequences.dropped,
        include_random=include_random,
    )


def read_log(path: Path) -> LogEvents:
    """Parse one log file's user_id, video_id, time_ms and action flags."""
    table = _read_table(path, schema.LOG_COLUMNS, LOG_TYPES, integers_only=True)
    actions = np.zeros(table.num_rows, np.uint8)
    for name, weight in zip(schema.ACTION_COLUMNS, schema.ACTION_WEIGHTS):
        flag = table.column(name).to_numpy()
        actions |= (flag != 0).view(np.uint8) * np.uint8(weight)
    return LogEvents(
        user_ids=table.column("user_id").to_numpy(),
        video_ids=table.column("video_id").to_numpy(),
        times_ms=table.column("time_ms").to_numpy(),
        actions=actions,
    )


def read_user_context(path: Path) -> UserContext:
    """Parse user_features: each contextual feature re-coded 1..k by order of first appearance."""
    table = _read_table(path, schema.USER_FEATURE_COLUMNS, _CONTEXT_TYPES, integers_only=False)
    user_ids = table.column("user_id").to_numpy()
    order = np.argsort(user_ids, kind="stable")
    repeated = np.flatnonzero(np.diff(user_ids[order]) == 0)
    if repeated.size:
        first, second = sorted(order[repeated[0] : repeated[0] + 2].tolist())
        raise RawDataError(
            f"{path}: line {second + 2}: user_id {user_ids[second]} repeats line {first + 2}"
        )
    codes = np.empty((len(user_ids), len(schema.CONTEXT_COLUMNS)), np.int64)
    for j, name in enumerate(schema.CONTEXT_COLUMNS):
        seen: dict[str, int] = {}
        column = table.column(name).to_pylist()
        codes[:, j] = [seen.setdefault(value, len(seen) + 1) for value in column]
    return UserContext(user_ids, codes)


def build_sequences(
    period1: LogEvents,
    period2: LogEvents,
    context: UserContext,
    extra: LogEvents | None = None,
) -> Sequences:
    """Join, concatenate and stably time-sort; see the module docstring for the rules."""
    in1, in2 = _distinct(period1.user_ids), _distinct(period2.user_ids)
    both = np.intersect1d(in1, in2, assume_unique=True)
    featured = np.isin(both, context.user_ids)
    kept = both[featured]
    dropped = DroppedUsers(
        one_period_only=len(in1) + len(in2) - 2 * len(both),
        no_user_features=int((~featured).sum()),
    )
    if kept.size == 0:
        raise RawDataError(
            "no user is in both standard logs and in user_features "
            f"({len(in1)} and {len(in2)} users in the logs, {len(context.user_ids)} featured)"
        )
    logs = [period1, period2] + ([extra] if extra is not None else [])
    picks = [_kept_slots(log.user_ids, kept) for log in logs]
    order, slots, times = _sort_events(logs, picks, kept.size)
    offsets = np.searchsorted(slots, np.arange(kept.size + 1)).astype(np.int64)
    del slots
    videos = np.concatenate([log.video_ids[pick] for log, (_, pick) in zip(logs, picks)])[order]
    actions = np.concatenate([log.actions[pick] for log, (_, pick) in zip(logs, picks)])[order]
    by_id = np.argsort(context.user_ids, kind="stable")
    feature_rows = by_id[np.searchsorted(context.user_ids[by_id], kept)]
    return Sequences(
        user_ids=kept.astype(np.int64),
        offsets=offsets,
        video_ids=videos,
        actions=actions,
        times_ms=times,
        context=context.codes[feature_rows],
        dropped=dropped,
    )


#: Ids below this use O(N) lookup tables (at most 32 MB) instead of sorting/searching.
_SMALL_IDS = 1 << 22


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct ids; a presence bitmap when ids are small non-negative ints (O(N))."""
    if ids.size and 0 <= ids.min() and ids.max() < _SMALL_IDS:
        return np.flatnonzero(np.bincount(ids)).astype(np.int64)
    return np.unique(ids)


def _kept_slots(user_ids: np.ndarray, kept: np.ndarray):
    """(slot of each kept event's user in `kept`, selector of the kept events).

    The selector is a plain slice when every event is kept, which saves a copy per column.
    """
    if user_ids.size and 0 <= user_ids.min() and user_ids.max() < _SMALL_IDS:
        table = np.full(max(int(user_ids.max()), int(kept.max())) + 1, -1, np.int64)
        table[kept] = np.arange(kept.size)
        slots = table[user_ids]
    else:
        pos = np.minimum(np.searchsorted(kept, user_ids), kept.size - 1)
        slots = np.where(kept[pos] == user_ids, pos, -1)
    keep = slots >= 0
    pick = slice(None) if keep.all() else keep
    return slots[pick], pick


def _sort_events(logs: list[LogEvents], picks, users: int):
    """Stable order of the kept events by (user slot, time_ms), ties in concatenation order.

    Returns (permutation, sorted slots, sorted times). Slot and time offset are packed into one
    int64 key when they fit, so one stable argsort (timsort: near-linear on logs already grouped
    by user) does the work and the sorted key yields both slots and times; else lexsort.
    """
    present = [log.times_ms for log in logs if len(log)]
    t0 = min(int(t.min()) for t in present)
    span_bits = (max(int(t.max()) for t in present) - t0).bit_length()
    if span_bits + max(1, (users - 1).bit_length()) <= 62:
        key = np.concatenate(
            [
                (slots << span_bits) | (log.times_ms[pick] - t0)
                for log, (slots, pick) in zip(logs, picks)
            ]
        )
        order = np.argsort(key, kind="stable")
        key = key[order]
        times = (key & ((1 << span_bits) - 1)) + t0
        key >>= span_bits
        return order, key, times
    slots = np.concatenate([slots for slots, _ in picks])
    times = np.concatenate([log.times_ms[pick] for log, (_, pick) in zip(logs, picks)])
    order = np.lexsort((times, slots))
    return order, slots[order], times[order]


# --- reading the raw CSVs -------------------------------------------------------------------

LOG_TYPES: dict[str, pa.DataType] = {
    "user_id": pa.int64(),
    "video_id": pa.int64(),
    "time_ms": pa.int64(),
    **{name: pa.int8() for name in schema.ACTION_COLUMNS},
}
_CONTEXT_TYPES: dict[str, pa.DataType] = {
    "user_id": pa.int64(),
    **{name: pa.string() for name in schema.CONTEXT_COLUMNS},
}
EXPECTED = {"int64": "an integer", "int8": "a 0/1 flag", "string": "UTF-8 text"}
_INTEGER = re.compile(rb"-?[0-9]+")
_TAIL_BYTES = 1 << 16


def _read_table(
    path: Path, expected: tuple[str, ...], types: dict[str, pa.DataType], integers_only: bool
) -> pa.Table:
    """Parse the `types` columns of a published CSV; any defect -> one-line RawDataError.

    Every row's column count is checked by the parser; the columns not in `types` are not
    converted, so only the last line (where a truncated download shows) is checked for their
    integer form.
    """
    header = read_header(path)
    missing = [name for name in expected if name not in header]
    if missing:
        raise RawDataError(f"{path}: header lacks column(s) {', '.join(missing)}")
    convert = pacsv.ConvertOptions(column_types=types, include_columns=list(types))
    try:
        table = pacsv.read_csv(path, convert_options=convert)
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise _locate(path, header, convert, exc) from None
    for name in types:
        column = table.column(name)
        if column.null_count:
            first = int(np.argmax(pc.is_null(column).to_numpy(zero_copy_only=False)))
            raise RawDataError(
                f"{path}: line {first + 2}, column {header.index(name) + 1} ({name}): "
                f"empty value (expected {EXPECTED[str(types[name])]})"
            )
    if integers_only:
        check_last_line(path, header)
    return table


def read_header(path: Path) -> list[str]:
    with open(path, "rb") as f:
        line = f.readline(1 << 20)
    if not line.strip():
        raise RawDataError(f"{path}: line 1: empty file (expected a header row)")
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RawDataError(f"{path}: line 1: header is not UTF-8 text") from None
    return [name.strip() for name in next(csv.reader([text]))]


def _locate(path: Path, header: list[str], convert, exc: Exception) -> RawDataError:
    """Turn a parse failure into 'file: line L, column C (name): problem'.

    pyarrow names the row only when it parses serially, so the failing file is parsed again
    that way (the error path only).
    """
    message = str(exc)
    try:
        pacsv.read_csv(path, pacsv.ReadOptions(use_threads=False), convert_options=convert)
    except (pa.ArrowInvalid, UnicodeDecodeError) as serial:
        message = str(serial)
    row = re.search(r"Row #(\d+)", message)
    where = f"line {row.group(1)}" if row else "a row"
    columns = re.search(r"Expected (\d+) columns, got (\d+)", message)
    if columns:
        expected, got = columns.groups()
        return RawDataError(
            f"{path}: {where}: expected {expected} columns, got {got} (truncated or malformed row)"
        )
    conversion = re.search(
        r"column #(\d+):.*conversion error to (\w+): invalid value '(.*)'", message
    )
    if conversion:
        index, kind, value = conversion.groups()
        name = header[int(index)] if int(index) < len(header) else "?"
        return RawDataError(
            f"{path}: {where}, column {int(index) + 1} ({name}): invalid value "
            f"{value[:40]!r} (expected {EXPECTED.get(kind, kind)})"
        )
    return RawDataError(f"{path}: {where}: {message.splitlines()[0] if message else 'unreadable'}")


def check_last_line(path: Path, header: list[str]) -> None:
    """The last line holds one integer per column (a cut-off download fails here)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - _TAIL_BYTES))
        tail = f.read()
    stripped = tail.rstrip(b"\r\n")
    if b"\n" not in stripped:
        return  # header only, or a last line longer than the tail: the parser judged it
    last = stripped.rsplit(b"\n", 1)[1].rstrip(b"\r")
    fields = last.split(b",")
    bad = [i for i, field in enumerate(fields) if not _INTEGER.fullmatch(field.strip())]
    if len(fields) == len(header) and not bad:
        return
    if len(fields) != len(header):
        problem = f"expected {len(header)} columns, got {len(fields)}"
    else:
        value = fields[bad[0]][:40].decode(errors="replace")
        problem = f"column {bad[0] + 1} ({header[bad[0]]}): invalid value {value!r}"
    with open(path, "rb") as f:
        newlines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    line = newlines - tail[len(stripped) :].count(b"\n") + 1
    cut = "" if tail.endswith(b"\n") else " (no final newline: truncated file?)"
    raise RawDataError(f"{path}: line {line}: {problem}{cut}")
