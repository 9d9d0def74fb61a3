"""Exact per-request records, streamed to disk as JSON lines while the run goes on.

Each line is written with a single os.write on an O_APPEND descriptor: once written it is in
the kernel's hands, so a process killed mid-run (even by SIGKILL) keeps every finished record.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import orjson


class RecordWriter:
    def __init__(self, directory: Path, role: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"records-{role}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict) -> None:
        if self._fd is not None:
            os.write(self._fd, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_records(directory: Path) -> list[dict]:
    """All records under `directory`; a torn last line (a kill mid-write) is skipped."""
    records = []
    for path in sorted(directory.glob("records-*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                records.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
    return records
