"""Which line of a server log says why it failed (logs as tritonserver and `server serve` write them)."""

from __future__ import annotations

from hstu_replay.process import server_error_line

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
