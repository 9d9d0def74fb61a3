"""The C++ reference replay (`cpp/replay/hstu_replay_dump`): build it (`cmake_build`), run it, parse it.

The program links only the libtorch inside the pip torch wheel and loads model.pt2 the way a C++
server does, so it checks a dump with no Python between the package and the logits.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from hstu_replay.cmake_build import ROOT, build_cmake
from hstu_replay.errors import HstuReplayError, InputError
from hstu_replay.verify import DEFAULT_TOLERANCE

SOURCE_DIR = ROOT / "cpp" / "replay"
DEFAULT_BUILD_DIR = ROOT / "build" / "replay"
BINARY_NAME = "hstu_replay_dump"
REPLAY_TIMEOUT_S = 600.0

# One line per batch, then a summary line (see hstu_replay_dump.cpp).
_BATCH_LINE = re.compile(
    r"(?P<name>batch_\d{6,}) max_abs_diff=(?P<max>\S+) mean_abs_diff=(?P<mean>\S+) rows=(?P<rows>\d+) "
    r"(?P<verdict>ok|FAIL)\b")
_WRITTEN_LINE = re.compile(r"(?P<name>batch_\d{6,}) wrote=compiled_logits rows=(?P<rows>\d+)$")


@dataclass(frozen=True)
class BatchDiff:
    name: str  # e.g. "batch_000003"
    max_abs_diff: float  # inf when the shapes differ
    mean_abs_diff: float
    rows: int  # rows of the program's output
    ok: bool


@dataclass(frozen=True)
class ReplayResult:
    batches: tuple[BatchDiff, ...]
    passed: bool  # every batch within the tolerance
    returncode: int  # 0 passed, 2 some batch did not
    output: str  # the program's stdout: one line per batch, then the summary

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.batches if not b.ok)


def build(build_dir: str | Path | None = None) -> Path:
    """Configure and build `hstu_replay_dump` unless the binary is newer than its sources."""
    return build_cmake(SOURCE_DIR, Path(build_dir) if build_dir is not None else DEFAULT_BUILD_DIR, BINARY_NAME,
                       "the C++ replay program", "C++ replay")


def replay(package: str | Path, dump_dir: str | Path, tolerance: float = DEFAULT_TOLERANCE,
           write_reference: str | None = None, *, build_dir: str | Path | None = None,
           timeout: float = REPLAY_TIMEOUT_S) -> ReplayResult:
    """Replay every batch of `dump_dir` through `package` in C++ (building the program if needed).

    Returns the comparison for exit codes 0 and 2; a usage or I/O error of the program (exit 1)
    raises InputError with its one-line message.
    """
    command = [str(build(build_dir)), "--package", str(package), "--dump-dir", str(dump_dir),
               "--tolerance", repr(float(tolerance))]
    if write_reference is not None:
        command += ["--write-reference", write_reference]
    proc = _run(command, dump_dir, timeout)
    batches = tuple(
        BatchDiff(m["name"], float(m["max"]), float(m["mean"]), int(m["rows"]), m["verdict"] == "ok")
        for m in map(_BATCH_LINE.match, proc.stdout.splitlines()) if m
    )
    return ReplayResult(batches, proc.returncode == 0, proc.returncode, proc.stdout)


def produce_reference(package: str | Path, dump_dir: str | Path, *, build_dir: str | Path | None = None,
                      timeout: float = REPLAY_TIMEOUT_S) -> int:
    """Write `package`'s logits for every batch of `dump_dir` as its `compiled_logits`, from C++.

    The dump must hold no reference logits yet (the program refuses before writing anything).
    Returns the number of batches written; an error of the program raises InputError.
    """
    command = [str(build(build_dir)), "--package", str(package), "--dump-dir", str(dump_dir), "--produce-reference"]
    proc = _run(command, dump_dir, timeout)
    written = [m for m in map(_WRITTEN_LINE.match, proc.stdout.splitlines()) if m]
    if proc.returncode != 0 or not written:
        raise InputError(f"{BINARY_NAME} wrote no reference into {dump_dir} (exit {proc.returncode})")
    return len(written)


def _run(command: list[str], dump_dir: str | Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the program; its comparison verdicts (exit 0, 2) come back, anything else raises."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HstuReplayError(f"the C++ replay of {dump_dir} did not finish within {timeout:g} s") from None
    if proc.returncode not in (0, 2):
        raise InputError(failure_line(proc))
    return proc


def failure_line(proc: subprocess.CompletedProcess[str]) -> str:
    """One line for a failed run: its own error line, or the signal that killed it and its last words
    (an abort's `terminate called ...` / `what(): ...`)."""
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode < 0:
        said = [line for line in lines if "what():" in line] or lines
        return f"{BINARY_NAME} was killed by signal {-proc.returncode}" + (f": {said[-1]}" if said else "")
    mine = [line for line in lines if line.startswith(f"{BINARY_NAME}: ")]
    line = (mine or lines or [f"{BINARY_NAME} exited with status {proc.returncode}"])[-1]
    return line.replace(f"{BINARY_NAME}: error: ", f"{BINARY_NAME}: ", 1)  # the CLI says "error:" itself
