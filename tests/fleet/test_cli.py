"""`hstu-replay fleet`: bad input is one line and exit 2 before anything starts; `gateway-config`
prints a configuration haproxy takes; `serve` runs a fleet and a gateway until SIGTERM, then
leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hstu_replay.cli import main
from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.fleet.gateway import haproxy_binary
from hstu_replay.request import build_request
from tests.conftest import ROOT
from tests.conftest import alive, tree
from tests.fleet.conftest import free_base, history_user, needs_haproxy

SERVE_START_S = 240.0

BACKENDS = ["--backend", "grpc=10.0.0.1:8001,http=10.0.0.1:8000", "--backend", "grpc=10.0.0.2:8001,http=10.0.0.2:8000"]


@pytest.mark.parametrize("argv, message", [
    (["fleet", "serve", "--servers", "0"], "--servers '0': must be >= 1"),
    (["fleet", "serve", "--servers", "two"], "--servers 'two': expected a number"),
    (["fleet", "serve", "--gateway", "least-conn"], "--gateway 'least-conn': use hash or round-robin"),
    (["fleet", "serve", "--routing-header", "x route"], "--routing-header 'x route'"),
    (["fleet", "serve", "--gateway-grpc-port", "70000"], "--gateway-grpc-port '70000': must be <= 65535"),
    (["fleet", "serve", "--cache-budget-tokens", "-5"], "--cache-budget-tokens '-5': must be >= 0"),
    (["fleet", "serve", "--base-port", "70000"], "--base-port '70000': must be <= 65535"),
    (["fleet", "serve", "--serve-args", "--threads '1"], "--serve-args"),
    (["fleet", "gateway-config"], "--backend: give one per server"),
    (["fleet", "gateway-config", *BACKENDS[:2], *BACKENDS[:2]], "address 10.0.0.1:8001 given twice"),
    (["fleet", "gateway-config", "--backend", "grpc=10.0.0.1:8001"], "--backend 'grpc=10.0.0.1:8001'"),
    (["fleet", "gateway-config", *BACKENDS, "--routing-header", "route:key"], "--routing-header 'route:key'"),
    (["fleet", "gateway-config", *BACKENDS, "--balance", "source"], "--balance 'source'"),
    (["fleet", "gateway-config", *BACKENDS, "--grpc-port", "8000", "--http-port", "8000"], "both on 8000"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err, captured.err


@needs_haproxy
@pytest.mark.parametrize("balance", ["hash", "round-robin"])
def test_gateway_config_is_what_haproxy_takes(capsys, tmp_path, balance):
    assert main(["fleet", "gateway-config", *BACKENDS, "--balance", balance, "--routing-header", "X-User"]) == 0
    text = capsys.readouterr().out
    assert "server s1 10.0.0.2:8001 " in text and "server s1 10.0.0.2:8000 " in text
    assert ("balance hdr(x-user)" in text) == (balance == "hash")
    (tmp_path / "haproxy.cfg").write_text(text)
    checked = subprocess.run([haproxy_binary(), "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def stop_for_sure(process: subprocess.Popen) -> None:
    """A `fleet serve` still up after its test (its servers run in sessions of their own, so it must
    stop them itself): SIGTERM, which it always honours, then a kill after two minutes."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()


@needs_haproxy
@pytest.mark.integration
def test_serve_runs_until_sigterm_and_leaves_nothing(compiled_repository, tmp_path):
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        base = free_base(4)
        process = subprocess.Popen([sys.executable, "-m", "hstu_replay.cli", "fleet", "serve", "--servers", "1",
                                    "--repository", str(compiled_repository), "--device", "cpu", "--gateway", "hash",
                                    "--base-port", str(base), "--log-dir", str(tmp_path / "fleet")],
                                   stdout=stdout, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + SERVE_START_S
        while "gateway (hash by x-hstu-route)" not in out.read_text():
            assert process.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        lines = out.read_text().splitlines()
        assert f"server 0: grpc 127.0.0.1:{base + 1}  http 127.0.0.1:{base}  metrics http://127.0.0.1:{base + 2}" \
               f"/metrics  cache metrics http://127.0.0.1:{base + 3}/metrics" in lines, lines
        gateway = next(line for line in lines if line.startswith("gateway ")).split()
        client = TritonClient(ClientOptions(url=gateway[gateway.index("grpc") + 1], route_header="x-hstu-route"))
        try:
            answer = client.infer(build_request([history_user(3, 12, 9_100_001)]), route_key=5)
        finally:
            client.close()
        assert answer.cached_tokens.tolist() == [0]
        family = tree(process.pid)
        assert len(family) > 3  # the command, its server and the gateway, tritonserver and its helpers
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, out.read_text()
    finally:
        stop_for_sure(process)
    assert "fleet stopped" in out.read_text()
    assert [pid for pid in family if alive(pid)] == []


@pytest.mark.integration
def test_serve_started_with_sigint_ignored_still_stops_on_sigint(compiled_repository, tmp_path):
    """A background job of a non-interactive shell (`hstu-replay fleet serve &` in a script) starts with
    SIGINT ignored; a long-running command restores Ctrl-C (process.long_running) and stops on it."""
    out = tmp_path / "out.txt"
    with out.open("w") as stdout:
        process = subprocess.Popen([sys.executable, "-m", "hstu_replay.cli", "fleet", "serve", "--servers", "1",
                                    "--repository", str(compiled_repository), "--device", "cpu",
                                    "--base-port", str(free_base(4)), "--log-dir", str(tmp_path / "fleet")],
                                   stdout=stdout, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ),
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + SERVE_START_S
        while "hstu-replay: serving; Ctrl-C or SIGTERM stops the fleet" not in out.read_text():
            assert process.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        family = tree(process.pid)
        process.send_signal(signal.SIGINT)
        assert process.wait(120) == 0, out.read_text()
    finally:
        stop_for_sure(process)
    assert "fleet stopped" in out.read_text()
    assert [pid for pid in family if alive(pid)] == []
