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


#: What a natural replay's report section and CSV read of each record (report.natural), in order.
ROW_FIELDS = ("t", "kind", "latency_ms", "tokens", "observed_hits", "predicted_hits", "ok", "label")


class RequestRows:
    """A natural replay's per-request rows, kept as its records are written (to `sink`, the
    records file, where there is one). They travel like the other statistics: a worker hands
    the rows it gathered since its last Locust report to the master (`take`), which adds them
    up (`merge`); the report is built from them, not from files the master may not see."""

    def __init__(self, sink: RecordWriter | None = None):
        self.sink = sink
        self.rows: list[tuple] = []

    def write(self, record: dict) -> None:
        if self.sink is not None:
            self.sink.write(record)
        hits = record["observed_hits"]
        self.rows.append((float(record["t"]), str(record["kind"]), float(record["latency_ms"]), int(record["tokens"]),
                          None if hits is None else int(hits), int(record["predicted_hits"]), bool(record["ok"]),
                          str(record["label"])))

    def take(self) -> list[tuple]:
        """The rows gathered since the last take (for a worker's report)."""
        rows, self.rows = self.rows, []
        return rows

    def merge(self, rows) -> None:
        self.rows.extend(tuple(row) for row in rows)

    def records(self) -> list[dict]:
        """The rows as records (the fields report.natural reads)."""
        return [dict(zip(ROW_FIELDS, row)) for row in self.rows]
