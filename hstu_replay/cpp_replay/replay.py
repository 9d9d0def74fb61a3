"""The C++ reference replay (`cpp/replay/hstu_replay_dump`): build it with CMake, run it, parse it.

The program links only the libtorch inside the pip torch wheel and loads model.pt2 the way a C++
server does, so it checks a dump with no Python between the package and the logits. torch is
never imported here: the wheel's CMake config is located from where torch is installed.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hstu_replay.errors import ConfigError, HstuReplayError, InputError
from hstu_replay.verify import DEFAULT_TOLERANCE

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIR = ROOT / "cpp" / "replay"
DEFAULT_BUILD_DIR = ROOT / "build" / "replay"
BINARY_NAME = "hstu_replay_dump"
BUILD_TIMEOUT_S = 900.0
REPLAY_TIMEOUT_S = 600.0
BUILD_JOBS = 2

# One line per batch, then a summary line (see hstu_replay_dump.cpp).
_BATCH_LINE = re.compile(
    r"(?P<name>batch_\d{6,}) max_abs_diff=(?P<max>\S+) mean_abs_diff=(?P<mean>\S+) rows=(?P<rows>\d+) "
    r"(?P<verdict>ok|FAIL)\b")
_WRITTEN_LINE = re.compile(r"(?P<name>batch_\d{6,}) wrote=compiled_logits rows=(?P<rows>\d+)$")
_DIAGNOSTIC = re.compile(r"\b(fatal )?error: ")  # gcc, clang, collect2
_ERROR_WORD = re.compile(r"\berror\b", re.IGNORECASE)
# make's own "*** [target] Error 1" and CMake's closing line repeat an error, they never explain it.
_ERROR_ECHO = re.compile(r"^(g?make(\[\d+\])?: \*\*\*|-- Configuring incomplete)")


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


def torch_cmake_prefix() -> Path:
    """`torch.utils.cmake_prefix_path`, found without importing torch (which takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("torch is not installed in this environment (pip install torch==2.13.0)")
    prefix = Path(list(spec.submodule_search_locations)[0]) / "share" / "cmake"
    if not (prefix / "Torch" / "TorchConfig.cmake").is_file():
        raise ConfigError(f"{prefix}: this torch install ships no CMake config for libtorch")
    return prefix


def find_compiler() -> str:
    """The C++ compiler: $CXX when set (it must exist), else c++, g++ or clang++ on PATH."""
    wanted = os.environ.get("CXX")
    if wanted:
        found = shutil.which(wanted)
        if not found:
            raise ConfigError(f"no C++ compiler found: CXX={wanted} is not an executable (install g++ or fix CXX)")
        return found
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError("no C++ compiler found (install g++, e.g. `apt-get install g++`, or set CXX)")


def _find_cmake() -> str:
    found = shutil.which("cmake")
    if not found:
        raise ConfigError("cmake not found (install cmake >= 3.18, e.g. `apt-get install cmake` or `pip install cmake`)")
    return found


def _is_current(binary: Path, inputs: list[Path]) -> bool:
    return binary.is_file() and binary.stat().st_mtime > max(p.stat().st_mtime for p in inputs)


def build(build_dir: str | Path | None = None) -> Path:
    """Configure and build `hstu_replay_dump` unless the binary is newer than its sources."""
    return build_cmake(SOURCE_DIR, Path(build_dir) if build_dir is not None else DEFAULT_BUILD_DIR, BINARY_NAME,
                       "the C++ replay program", "C++ replay")


def build_cmake(source_dir: Path, build_dir: Path, artifact: str, title: str, what: str,
                defines: tuple[str, ...] = ()) -> Path:
    """Configure and build `source_dir` against the torch wheel's libtorch into `build_dir` unless
    `artifact` there is newer than the sources (`title` names it in the progress lines, `what` in errors;
    `defines`: more -D settings for CMake).

    The sources include torch's TorchConfig.cmake, so another torch install triggers a rebuild.
    A file lock keeps two processes from building into one directory at once.
    """
    binary = build_dir / artifact
    prefix = torch_cmake_prefix()
    inputs = [p for p in source_dir.iterdir() if p.is_file()] if source_dir.is_dir() else []
    if not inputs:
        raise ConfigError(f"{source_dir}: the {what} sources are missing (use a source checkout)")
    inputs.append(prefix / "Torch" / "TorchConfig.cmake")
    if _is_current(binary, inputs):
        return binary
    compiler, cmake = find_compiler(), _find_cmake()
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_current(binary, inputs):  # built by another process while we waited
            return binary
        print(f"hstu-replay: building {title} in {build_dir} (one time)...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        log = build_dir / "build.log"
        log.write_text("")
        # No CMAKE_BUILD_TYPE: the work happens inside libtorch, and an unoptimised build of the
        # glue compiles about a third faster on a 2-core machine (a CMakeLists may pick its own).
        _run_logged([cmake, "-S", str(source_dir), "-B", str(build_dir), f"-DCMAKE_PREFIX_PATH={prefix}",
                     f"-DCMAKE_CXX_COMPILER={compiler}", *(f"-D{d}" for d in defines)], log, "configuring", what)
        _run_logged([cmake, "--build", str(build_dir), "--parallel", str(BUILD_JOBS)], log, "compiling", what)
        if not binary.is_file():
            raise ConfigError(f"the {what} build produced no {binary} (log: {log})")
        binary.touch()  # newer than every input even when make found nothing to redo
        print(f"hstu-replay: built {binary} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return binary


def _run_logged(command: list[str], log: Path, step: str, what: str) -> None:
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"the {what} build timed out while {step} (over {BUILD_TIMEOUT_S:g} s)") from None
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n{proc.stdout}\n")
    if proc.returncode != 0:
        raise ConfigError(f"the {what} build failed while {step}: {last_error_line(proc.stdout)} (log: {log})")


def last_error_line(output: str) -> str:
    """The line that says what went wrong, not make's echo of it.

    In order: the last compiler diagnostic (`file:line:col: error: ...`); else CMake's first error
    with the first sentence of its (indented, wrapped) message; else the last line naming an error.
    """
    lines = [line.strip() for line in output.splitlines()]
    diagnostics = [line for line in lines if _DIAGNOSTIC.search(line)]
    if diagnostics:
        return diagnostics[-1]
    for index, line in enumerate(lines):
        if line.startswith("CMake Error"):
            sentence: list[str] = []
            for rest in lines[index + 1 : index + 12]:
                sentence += [rest] if rest else []
                if rest.endswith((".", ":")):
                    break
            return " ".join([line, *sentence])
    mentions = [line for line in lines if _ERROR_WORD.search(line) and not _ERROR_ECHO.match(line)]
    return (mentions or [line for line in lines if line] or ["no output"])[-1]


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
