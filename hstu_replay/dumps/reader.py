"""Read a reference dump directory into batches of named numpy arrays (no torch needed).

Files are grouped by their `batch_%06d_` prefix; each tensor is checked against the dtype and
rank the HSTU interface gives it, so later stages can trust what they get.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hstu_replay.dumps.archive import read_feature_keys, read_tensor_file
from hstu_replay.errors import InputError
from hstu_replay.interface import NUM_TASKS

_BATCH_FILE = re.compile(r"batch_(\d{6,})_([A-Za-z0-9_]+)\.pt")
FEATURE_KEYS_FILE = "feature_keys.pt"

#: Every batch has these inputs (the no-cache exporter writes only these).
REQUIRED = ("values", "lengths", "num_candidates")
#: Jagged int64 inputs: 1-D.
INT64_1D = ("values", "lengths", "num_candidates", "user_ids", "total_history_lengths")
#: Reference logits: float32 [N, NUM_TASKS].
LOGITS = ("compiled_logits", "ref_logits")


@dataclass(frozen=True)
class DumpBatch:
    name: str  # e.g. "batch_000000"
    index: int
    tensors: dict[str, np.ndarray]

    @property
    def logits(self) -> np.ndarray | None:
        """The reference logits, compiled (kv-cache exporter) or eager (no-cache exporter)."""
        return next((self.tensors[k] for k in LOGITS if k in self.tensors), None)


def _check(path: Path, name: str, array: np.ndarray) -> None:
    if name in INT64_1D:
        ok, expected = array.dtype == np.int64 and array.ndim == 1, "1-D int64"
    elif name == "compiled_offload_task_ids":
        ok, expected = array.dtype == np.int64, "int64"
    elif name in LOGITS:
        ok = array.dtype == np.float32 and array.ndim == 2 and array.shape[1] == NUM_TASKS
        expected = f"float32 [N, {NUM_TASKS}]"
    else:
        return
    if not ok:
        raise InputError(f"{path}: expected {expected}, found {array.dtype} {list(array.shape)}")


def _list_batches(directory: Path) -> list[tuple[int, str, dict[str, Path]]]:
    if not directory.is_dir():
        raise InputError(f"{directory}: no such dump directory")
    groups: dict[int, tuple[str, dict[str, Path]]] = {}
    for path in directory.iterdir():
        match = _BATCH_FILE.fullmatch(path.name)
        if not match or not path.is_file():
            continue  # feature_keys.pt and anything else the exporter may add
        index, prefix = int(match[1]), f"batch_{match[1]}"
        name, files = groups.setdefault(index, (prefix, {}))
        if name != prefix:
            raise InputError(f"{directory}: both {name} and {prefix} claim batch {index}")
        files[match[2]] = path
    if not groups:
        raise InputError(f"{directory}: no batch_NNNNNN_<name>.pt files")
    batches = [(i, *groups[i]) for i in sorted(groups)]
    for _, name, files in batches:
        missing = [k for k in REQUIRED if k not in files]
        if missing:
            raise InputError(f"{directory}: {name} lacks {', '.join(missing)}")
    return batches


def iter_dump(directory: str | Path) -> Iterator[DumpBatch]:
    """Batches in index order, each read when reached; the listing is checked up front."""
    batches = _list_batches(Path(directory))

    def read() -> Iterator[DumpBatch]:
        for index, name, files in batches:
            tensors = {}
            for key, path in sorted(files.items()):
                tensors[key] = read_tensor_file(path)
                _check(path, key, tensors[key])
            yield DumpBatch(name, index, tensors)

    return read()


def read_dump(directory: str | Path) -> list[DumpBatch]:
    """Every batch of the dump in `directory`, sorted by index."""
    return list(iter_dump(directory))


def read_dump_feature_keys(directory: str | Path) -> list[str] | None:
    """The dump's `feature_keys.pt`, parsed safely; None when the exporter wrote none."""
    path = Path(directory) / FEATURE_KEYS_FILE
    return read_feature_keys(path) if path.is_file() else None
