"""The C++ reference replay: built once per module with CMake against the torch wheel's libtorch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hstu_replay.cli import main
from hstu_replay.dumps.archive import read_tensor_file
from hstu_replay.dumps.reader import read_dump
from hstu_replay.dumps.writer import write_tensor_file
from hstu_replay.errors import ConfigError, InputError
import hstu_replay.cpp_replay.replay as cpp_replay

SAME_PACKAGE_TOLERANCE = 1e-4  # one package, CPU fp32: the C++ and Python runs agree this closely


def _package(repository: Path) -> Path:
    return repository / "hstu_gr_ranking" / "1" / "model.pt2"


@pytest.fixture(scope="module")
def replay_binary() -> Path:
    return cpp_replay.build()


@pytest.fixture(scope="module")
def native_dumps(replay_binary, reference_dumps, compiled_repository, tmp_path_factory) -> Path:
    """A copy of the reference dumps plus the C++ outputs written as `native_logits`."""
    copy = tmp_path_factory.mktemp("native") / "dumps"
    shutil.copytree(reference_dumps, copy)
    result = cpp_replay.replay(_package(compiled_repository), copy, write_reference="native_logits")
    assert result.returncode == 0, result.output
    return copy


@pytest.mark.integration
def test_native_replay_passes_on_reference_dumps(replay_binary, reference_dumps, compiled_repository):
    result = cpp_replay.replay(_package(compiled_repository), reference_dumps)
    references = {b.name: b.logits for b in read_dump(reference_dumps)}
    assert (result.returncode, result.passed, result.failed) == (0, True, ())
    assert [b.name for b in result.batches] == sorted(references) and len(result.batches) == 6
    for batch in result.batches:
        assert batch.ok and batch.max_abs_diff <= SAME_PACKAGE_TOLERANCE and batch.mean_abs_diff <= batch.max_abs_diff
        assert batch.rows == len(references[batch.name])
    assert result.output.splitlines()[-1].startswith("summary batches=6 failed=0 ")
    assert not list(reference_dumps.glob("*native*"))  # nothing written without --write-reference


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_native_written_reference_reads_with_both_readers(native_dumps):
    import torch

    written = sorted(native_dumps.glob("batch_*_native_logits.pt"))
    assert len(written) == 6
    for path in written:
        ours = read_tensor_file(path)  # the torch-free reader
        theirs = torch.jit.load(str(path)).tensor
        compiled = read_tensor_file(path.with_name(path.name.replace("native_logits", "compiled_logits")))
        assert ours.dtype == np.float32 and ours.shape == compiled.shape
        np.testing.assert_array_equal(ours, theirs.numpy())
        np.testing.assert_allclose(ours, compiled, rtol=0, atol=SAME_PACKAGE_TOLERANCE)
    assert not list(native_dumps.glob("*.partial"))


@pytest.mark.integration
def test_native_outputs_agree_with_python_in_process(native_dumps, compiled_repository):
    from hstu_replay.request import RequestTensors
    from hstu_replay.server.build import load_engines

    engine = load_engines(compiled_repository, None, 32, "cpu").uncached
    fields = ("values", "lengths", "num_candidates", "user_ids", "total_history_lengths")
    for batch in read_dump(native_dumps):
        python_logits = engine.infer(RequestTensors.of(**{k: batch.tensors[k] for k in fields})).logits
        np.testing.assert_allclose(batch.tensors["native_logits"], python_logits, rtol=0, atol=SAME_PACKAGE_TOLERANCE)


@pytest.mark.integration
def test_native_produces_the_reference_of_a_dump_without_one(replay_binary, reference_dumps, compiled_repository,
                                                              tmp_path, capsys):
    bare = tmp_path / "dumps"
    shutil.copytree(reference_dumps, bare)
    originals = {p.name: read_tensor_file(p) for p in bare.glob("batch_*_compiled_logits.pt")}
    for name in originals:
        (bare / name).unlink()
    assert main(["cpp-replay", "run", "--repository", str(compiled_repository), "--dump-dir", str(bare),
                 "--produce-reference"]) == 0
    assert capsys.readouterr().out == f"hstu-replay: wrote compiled_logits for 6 batches into {bare}\n"
    assert sorted(p.name for p in bare.glob("batch_*_compiled_logits.pt")) == sorted(originals)
    for name, python_logits in originals.items():  # written by Python's run of the same package
        produced = read_tensor_file(bare / name)
        assert produced.dtype == np.float32 and produced.shape == python_logits.shape
        np.testing.assert_allclose(produced, python_logits, rtol=0, atol=SAME_PACKAGE_TOLERANCE)
    assert cpp_replay.replay(_package(compiled_repository), bare).passed

    # A dump that already has references is refused before anything is written.
    (bare / "batch_000004_compiled_logits.pt").unlink()
    with pytest.raises(InputError, match="batch_000000 already has reference logits") as refused:
        cpp_replay.produce_reference(_package(compiled_repository), bare)
    assert "\n" not in str(refused.value)
    assert not (bare / "batch_000004_compiled_logits.pt").exists()


@pytest.mark.integration
def test_native_replay_fails_on_a_corrupted_dump_naming_the_batch(replay_binary, reference_dumps,
                                                                  compiled_repository, tmp_path, capsys):
    corrupted = tmp_path / "dumps"
    shutil.copytree(reference_dumps, corrupted)
    logits_3 = corrupted / "batch_000003_compiled_logits.pt"
    wrong = read_tensor_file(logits_3).copy()
    wrong[5, 2] += 1.0
    write_tensor_file(logits_3, wrong)
    logits_1 = corrupted / "batch_000001_compiled_logits.pt"
    write_tensor_file(logits_1, read_tensor_file(logits_1)[:-1].copy())  # one row short

    result = cpp_replay.replay(_package(compiled_repository), corrupted)
    assert (result.returncode, result.passed, result.failed) == (2, False, ("batch_000001", "batch_000003"))
    by_name = {b.name: b for b in result.batches}
    assert by_name["batch_000003"].max_abs_diff == pytest.approx(1.0, abs=SAME_PACKAGE_TOLERANCE)
    assert by_name["batch_000003"].mean_abs_diff == pytest.approx(1.0 / by_name["batch_000003"].rows / 8, rel=1e-3)
    assert by_name["batch_000001"].max_abs_diff == float("inf")
    assert "batch_000001 max_abs_diff=inf" in result.output and "shape=128x8 reference_shape=127x8" in result.output

    # The command line prints the program's lines and exits with its code.
    code = main(["cpp-replay", "run", "--repository", str(compiled_repository), "--dump-dir", str(corrupted)])
    out = capsys.readouterr().out
    assert code == 2
    assert any(line.startswith("batch_000003 max_abs_diff=1 ") and line.endswith(" FAIL") for line in out.splitlines())
    assert out.splitlines()[-1].startswith("summary batches=6 failed=2 ")
    assert out.splitlines()[-1].endswith(" FAIL")
    # A looser tolerance accepts the +1.0 logit, never the missing row.
    assert cpp_replay.replay(_package(compiled_repository), corrupted, tolerance=1.5).failed == ("batch_000001",)


@pytest.mark.integration
def test_native_cli_replay_of_a_repository_passes(replay_binary, reference_dumps, compiled_repository, capsys):
    code = main(["cpp-replay", "run", "--repository", str(compiled_repository), "--dump-dir", str(reference_dumps),
                 "--tolerance", "0.0001"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert len(lines) == 7 and lines[-1].endswith(" PASS") and "tolerance=0.0001" in lines[-1]


@pytest.mark.integration  # builds the C++ replay (about 45 s on a CPU)
def test_native_io_and_usage_errors_are_one_line(replay_binary, tmp_path, capsys):
    with pytest.raises(InputError, match="no such dump directory") as missing:
        cpp_replay.replay(tmp_path / "model.pt2", tmp_path / "absent")
    with pytest.raises(InputError, match="would overwrite the dump's own tensors") as reserved:
        cpp_replay.replay(tmp_path / "model.pt2", tmp_path, write_reference="compiled_logits")
    (tmp_path / "batch_000000_values.pt").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="no AOTInductor package there") as no_package:
        cpp_replay.replay(tmp_path / "model.pt2", tmp_path)
    for error in (missing, reserved, no_package):
        assert "\n" not in str(error.value)
    assert main(["cpp-replay", "run", "--package", str(tmp_path / "model.pt2"), "--dump-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.integration  # builds the C++ replay (about 45 s on a CPU)
def test_native_build_is_cached(replay_binary):
    stamp = replay_binary.stat().st_mtime_ns
    started = time.perf_counter()
    assert cpp_replay.build() == replay_binary
    assert time.perf_counter() - started < 1.0
    assert replay_binary.stat().st_mtime_ns == stamp


def test_native_build_without_a_compiler_is_one_line(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(ConfigError) as no_compiler:
        cpp_replay.build(tmp_path / "fresh")
    assert str(no_compiler.value).startswith("no C++ compiler found (install g++")
    monkeypatch.setenv("CXX", str(tmp_path / "nonexistent" / "g++"))
    with pytest.raises(ConfigError, match="^no C\\+\\+ compiler found: CXX=") as bad_cxx:
        cpp_replay.build(tmp_path / "fresh")
    for error in (no_compiler, bad_cxx):
        assert "\n" not in str(error.value)
    assert not (tmp_path / "fresh").exists()

    assert main(["cpp-replay", "build", "--build-dir", str(tmp_path / "fresh")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hstu-replay: error: no C++ compiler found") and err.count("\n") == 1


def test_native_failed_build_reports_the_compiler_error(tmp_path, monkeypatch):
    sources = tmp_path / "src"
    sources.mkdir()
    shutil.copy(cpp_replay.SOURCE_DIR / "CMakeLists.txt", sources)
    (sources / "hstu_replay_dump.cpp").write_text("#error broken on purpose\nint main() { return 0; }\n")
    monkeypatch.setattr(cpp_replay, "SOURCE_DIR", sources)
    with pytest.raises(ConfigError) as failed:
        cpp_replay.build(tmp_path / "build")
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("the C++ replay build failed while compiling: ")
    assert "hstu_replay_dump.cpp:1:2: error: #error broken on purpose" in message
    assert str(tmp_path / "build" / "build.log") in message


@pytest.mark.parametrize(("output", "expected"), [
    ("x.cpp:3:1: error: first\n  3 | error here\ngmake[2]: *** [x.o] Error 1\nx.cpp:9:1: error: last\n"
     "gmake: *** [all] Error 2\n", "x.cpp:9:1: error: last"),
    ("-- stuff\nCMake Error at CMakeLists.txt:15 (find_package):\n  By not providing \"FindTorch.cmake\" this\n"
     "  project failed.\n\n  More.\n-- Configuring incomplete, errors occurred!\n",
     'CMake Error at CMakeLists.txt:15 (find_package): By not providing "FindTorch.cmake" this project failed.'),
    ("gmake: *** [all] Error 2\nld: cannot find -ltorch\n", "ld: cannot find -ltorch"),
    ("", "no output"),
])
def test_native_last_error_line(output, expected):
    from hstu_replay.cmake_build import last_error_line

    assert last_error_line(output) == expected


def test_an_aborted_replay_keeps_its_last_words():
    # a real process that aborts as an uncaught C++ exception does: its message, then SIGABRT
    script = ("import os, sys; sys.stderr.write(\"terminate called after throwing an instance of 'c10::Error'\\n"
              "  what():  Expected all tensors to be on the same device\\n\"); sys.stderr.flush(); os.abort()")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -6
    assert cpp_replay.failure_line(proc) == ("hstu_replay_dump was killed by signal 6: what():  Expected all tensors "
                                         "to be on the same device")
    silent = subprocess.run([sys.executable, "-c", "import os; os.abort()"], capture_output=True, text=True,
                            timeout=60)
    assert cpp_replay.failure_line(silent) == "hstu_replay_dump was killed by signal 6"
