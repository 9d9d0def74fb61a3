"""A child's lifecycle: which line of its log says why it failed (logs as tritonserver and `server
serve` write them), start, readiness, stop and teardown against a stand-in server; the stop policies
(the signal to the leader or its session, the grace, the kill) and leftovers against small children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from hstu_replay import process
from hstu_replay.cli import main
from hstu_replay.process import (
    SERVED_MODELS, Child, Ports, ServerProcess, StartFailed, Stopping, port_free, server_error_line,
)
from tests.kernel import running  # the kernel's view, not the child type's psutil

TRITON_BIND_FAILURE = """\
E1130 19:16:04.052576 23340 server.cc:241] "CudaDriverHelper has not been initialized."
W1130 19:16:08.100000 23340 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory"
I1130 19:16:08.200000 23340 server.cc:674] "Waiting for in-flight requests to complete."
E1130 19:16:08.300000 23340 main.cc:255] "failed to start GRPC service: Unavailable - Socket '127.0.0.1:8001' already in use"
E1130 19:16:08.310000 23340 model_repository_manager.cc:470] "Failed to set config modification time: model_config_content_name_ is empty"
Traceback (most recent call last):
pytriton.exceptions.PyTritonError: Triton Inference Server exited with failure
hstu-replay: error: tritonserver exited unexpectedly; see its log above
"""


def test_tritonservers_own_error_comes_before_the_wrappers():
    assert server_error_line(TRITON_BIND_FAILURE) == (
        "E1130 19:16:08.300000 23340 main.cc:255] \"failed to start GRPC service: Unavailable - "
        "Socket '127.0.0.1:8001' already in use\"")


def test_our_one_line_error_when_tritonserver_said_nothing():
    log = ("hstu-replay: model threads 1\n"
           'E1130 19:16:04.052576 23340 server.cc:241] "CudaDriverHelper has not been initialized."\n'
           "hstu-replay: error: http port 5 on 127.0.0.1 is taken (Address already in use); choose another\n")
    assert server_error_line(log) == "hstu-replay: error: http port 5 on 127.0.0.1 is taken (Address already in use); choose another"


def test_the_last_line_of_a_traceback_then_the_last_line():
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nRuntimeError: no libtorch_cuda.so\n\n'
    assert server_error_line(traceback) == "RuntimeError: no libtorch_cuda.so"
    assert server_error_line("starting\nKilled\n") == "Killed"
    assert server_error_line("") == "no output"


# -- ServerProcess and `server wait` against a stand-in server (a child answering Triton's ready URL) --

STAND_IN = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class Ready(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/models/m/ready" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("stand-in: serving", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Ready).serve_forever()
"""


def test_a_server_is_started_waited_for_and_stopped_with_nothing_left(tmp_path):
    ports = Ports.free(cache_metrics=False)
    server = ServerProcess([sys.executable, "-c", STAND_IN, str(ports.http)], tmp_path / "log", ports, ("m",),
                           ready_timeout_s=30)
    with server:
        assert not port_free(ports.http) and server.failure() is None
        assert server.grpc_url == f"127.0.0.1:{ports.grpc}"
    teardown = server.stop()  # again: the same answer
    assert teardown.exit_code == -15 and teardown.clean and not teardown.forced
    assert port_free(ports.http) and server.process.pid in server.family


def test_ctrl_c_in_the_middle_of_the_start_still_leaves_a_server_that_can_be_stopped(tmp_path, monkeypatch,
                                                                                    foreground_sigint):
    """The interrupt lands inside `Popen`, after the child exists: it is raised once the child is kept."""
    popen = subprocess.Popen

    def interrupted_popen(*args, **kwargs):
        child = popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return child

    monkeypatch.setattr(subprocess, "Popen", interrupted_popen)
    ports = Ports.free(cache_metrics=False)
    server = ServerProcess([sys.executable, "-c", STAND_IN, str(ports.http)], tmp_path / "log", ports, ("m",))
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.process is not None
    teardown = server.stop()
    assert teardown.clean and server.process.poll() is not None and port_free(ports.http)


def test_a_server_that_dies_while_starting_is_named_by_its_own_error_line(tmp_path):
    ports = Ports.free(cache_metrics=False)
    command = [sys.executable, "-c", "import sys; print('hstu-replay: error: --config x: unknown'); sys.exit(2)"]
    server = ServerProcess(command, tmp_path / "log", ports, ready_timeout_s=30)
    with pytest.raises(StartFailed, match=r"exited \(exit 2\) while starting: hstu-replay: error: --config x"):
        server.launch()
    assert server.stop().exit_code == 2


def test_not_ready_in_time_is_a_start_failure_and_the_server_is_stopped(tmp_path):
    ports = Ports.free(cache_metrics=False)
    server = ServerProcess([sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"],
                           tmp_path / "log", ports, ready_timeout_s=0.5)
    with pytest.raises(StartFailed, match=f"models {', '.join(SERVED_MODELS)} not ready after 0.5 s; last log line: loading"):
        server.launch()
    assert server.process.poll() is not None


def test_server_wait_for_a_server_a_script_started(tmp_path, capsys):
    class Ready(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            ready = [f"/v2/models/{model}/ready" for model in SERVED_MODELS]
            self.send_response(200 if self.path in ready else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    http = HTTPServer(("127.0.0.1", 0), Ready)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        log = tmp_path / "server.log"
        log.write_text("")
        args = ["server", "wait", "--http-port", str(http.server_port), "--log", str(log), "--timeout", "10"]
        assert main([*args, "--pid", str(os.getpid())]) == 0
        assert "ready on http port" in capsys.readouterr().out
        gone = subprocess.Popen([sys.executable, "-c", "print('E1130 12:00:00.1 1 main.cc:1] bind failed')"],
                                stdout=log.open("w"))
        gone.wait()
        free = Ports.free(cache_metrics=False).http
        assert main(["server", "wait", "--http-port", str(free), "--log", str(log), "--pid", str(gone.pid)]) == 2
        err = capsys.readouterr().err
        assert f"process {gone.pid} is gone" in err and "main.cc:1] bind failed" in err
    finally:
        http.shutdown()


# -- Child: stop policies and leftovers, against small children ----------------------------------

# Prints its pid and its own child's (a sleeper, in the same session unless `own_session`), then waits.
PARENT = """
import os, signal, subprocess, sys, time
if {ignore_term}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                            "time.sleep(60)"], start_new_session={own_session})
print("pids", os.getpid(), sleeper.pid, flush=True)
time.sleep(60)
"""


def started_pids(child: Child, timeout_s: float = 30.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in child.log.read_text().splitlines():
            if line.startswith("pids "):
                own, sleeper = line.split()[1:]
                return int(own), int(sleeper)
        time.sleep(0.05)
    raise AssertionError(f"no pids in {child.log}")


def parent(tmp_path, stopping: Stopping, ignore_term: bool = False, own_session: bool = False) -> Child:
    code = PARENT.format(ignore_term=ignore_term, own_session=own_session)
    return Child([sys.executable, "-c", code], tmp_path / "child.log", stopping=stopping)


def test_the_stop_signal_to_the_session_reaches_what_the_child_started(tmp_path):
    child = parent(tmp_path, Stopping(signal.SIGKILL, 10.0, group=True))
    child.start()
    own, sleeper = started_pids(child)
    assert own == child.pid
    teardown = child.stop()
    assert teardown.exit_code == -signal.SIGKILL and teardown.clean and not teardown.forced
    assert {own, sleeper} <= set(child.family) and not running(own) and not running(sleeper)


def test_a_child_ignoring_its_stop_signal_is_killed_after_the_grace(tmp_path):
    child = parent(tmp_path, Stopping(signal.SIGTERM, 0.5), ignore_term=True)
    child.start()
    own, sleeper = started_pids(child)
    begin = time.monotonic()
    teardown = child.stop()
    assert time.monotonic() - begin < 10  # 0.5 s of grace, then SIGKILL to the session
    assert teardown.exit_code == -signal.SIGKILL and teardown.clean and not teardown.forced
    assert not running(own) and not running(sleeper)


def test_a_leftover_outside_the_session_is_killed_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "GONE_TIMEOUT_S", 1.0)
    child = parent(tmp_path, Stopping(signal.SIGTERM, 10.0, group=True), own_session=True)
    child.start()
    own, sleeper = started_pids(child)
    child.note_family()
    teardown = child.stop()
    assert teardown.exit_code == -signal.SIGTERM  # the leader went; its sleeper, in a session of its own, stayed
    assert teardown.forced == (f"pid {sleeper}",) and teardown.clean
    assert not running(sleeper)


def test_wait_samples_until_the_child_ends_or_the_time_is_up(tmp_path):
    rounds = []
    ends = Child([sys.executable, "-c", "import time, sys; time.sleep(1.0); sys.exit(3)"], tmp_path / "ends.log")
    ends.start()
    assert ends.wait(30, 0.1, lambda: rounds.append(time.monotonic())) is True
    assert ends.exited() == "exit 3" and len(rounds) >= 3
    assert ends.failure() == f"the child exited (exit 3): no output (log: {tmp_path / 'ends.log'})"
    hangs = Child([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "hangs.log")
    with hangs:
        assert hangs.wait(0.5, 0.1) is False and hangs.running
    assert hangs.stop().exit_code == -signal.SIGTERM and ends.stop().exit_code == 3


def test_a_child_without_a_log_writes_into_ours(capfd):
    child = Child([sys.executable, "-c", "print('into the parent', flush=True)"], None)
    child.start()
    assert child.wait(30) and child.failure() == "the child exited (exit 0); see its output above"
    assert "into the parent" in capfd.readouterr().out
    assert child.stop().clean


def test_a_readiness_predicate_and_a_child_that_is_never_ready(tmp_path):
    flag = tmp_path / "ready"
    code = f"import pathlib, time; time.sleep(0.5); pathlib.Path({str(flag)!r}).touch(); time.sleep(60)"
    with Child([sys.executable, "-c", code], tmp_path / "log", ready=flag.exists, ready_timeout_s=30) as child:
        assert flag.exists() and child.running
    never = Child([sys.executable, "-c", "print('loading', flush=True); import time; time.sleep(60)"],
                  tmp_path / "never.log", name="the helper", ready=lambda: False, what="the helper's socket",
                  ready_timeout_s=0.5)
    with pytest.raises(StartFailed, match=r"the helper's socket not ready after 0.5 s; last log line: loading"):
        never.launch()
    assert not never.running


def test_a_long_running_command_takes_ctrl_c_back_when_started_with_it_ignored():
    """A script's background job inherits SIGINT ignored; the command's entry restores Ctrl-C."""
    seen = []
    command = process.long_running(lambda args: seen.append(signal.getsignal(signal.SIGINT)) or 7)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert command(None) == 7
        assert seen == [signal.default_int_handler]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_every_long_running_command_honours_ctrl_c():
    from hstu_replay.cli import build_parser

    commands = {}
    for group, parser in build_parser()._subparsers._group_actions[0].choices.items():
        for action in parser._subparsers._group_actions if parser._subparsers else ():
            for name, sub in action.choices.items():
                commands[(group, name)] = sub.get_default("func")
    long_running = {("server", "serve"), ("server", "export"), ("server", "dump"), ("fleet", "serve"),
                    ("capacity", "run"), ("capacity", "natural"), ("flow", "l0"), ("protocol", "run"),
                    ("cpp-replay", "build"), ("cpp-replay", "run"), ("data", "prepare"), ("plan", "cache-curve")}
    assert long_running <= set(commands), long_running - set(commands)
    assert [key for key in sorted(long_running) if not hasattr(commands[key], "__wrapped__")] == []
