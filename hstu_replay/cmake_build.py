"""Building our C++ (the replay program, the Triton backend) with CMake against the torch wheel's libtorch.

torch is never imported here: the wheel's CMake config is located from where torch is installed.
A build runs once: again only when a source, or the torch install, is newer than what it made.
A failed build is one line: the compiler's (or CMake's) own error, with the log's path.
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
from pathlib import Path

from hstu_replay.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 900.0
BUILD_JOBS = 2

_DIAGNOSTIC = re.compile(r"\b(fatal )?error: ")  # gcc, clang, collect2
_ERROR_WORD = re.compile(r"\berror\b", re.IGNORECASE)
# make's own "*** [target] Error 1" and CMake's closing line repeat an error, they never explain it.
_ERROR_ECHO = re.compile(r"^(g?make(\[\d+\])?: \*\*\*|-- Configuring incomplete)")


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
