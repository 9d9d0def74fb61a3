"""Who can reach a Locust process: loopback by default, explicit bind hosts, Locust's login.

Real Locust processes (web UI and master idle: no server needed); the listening addresses are
read from the kernel (/proc/net/tcp), not from Locust.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_ports, locust_command

pytestmark = pytest.mark.integration


def listening(port: int) -> set[str]:
    """The addresses something listens on at `port`, from the kernel's socket tables."""
    found = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                # the kernel writes each 32-bit word in host (little-endian) order
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(family, raw))
    return found


def start(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    log = (tmp_path / "locust.log").open("w")
    return subprocess.Popen(locust_command("--workload", "dumps", "--dump-dir", str(tmp_path), *args),
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


def wait_listening(port: int, process: subprocess.Popen, timeout: float = 60.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if addresses := listening(port):
            return addresses
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {port} (exit {process.poll()})")


def interrupt(process: subprocess.Popen, timeout: float = 30.0, signum: int = signal.SIGINT) -> float:
    """SIGINT (Ctrl-C) or `signum`; seconds until the process is gone."""
    began = time.monotonic()
    process.send_signal(signum)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        raise AssertionError(f"still running {timeout} s after {signal.Signals(signum).name}") from None
    return time.monotonic() - began


def test_the_web_ui_and_the_master_listen_on_loopback_by_default(tmp_path):
    web, master = free_ports(2)
    process = start(tmp_path, "--master", "--web-port", str(web), "--master-bind-port", str(master))
    try:
        assert wait_listening(web, process) == {"127.0.0.1"}
        assert wait_listening(master, process) == {"127.0.0.1"}
        with urllib.request.urlopen(f"http://127.0.0.1:{web}/", timeout=10) as response:
            page = response.read().decode()
        assert '"host": "grpc://127.0.0.1:8001"' in page  # the form's Host field: the Triton address
    finally:
        took = interrupt(process)
    print(f"idle web UI master: exit {took:.2f} s after SIGINT")
    assert took < 15  # the product's bound is 5 s; margin for a loaded machine
    assert process.returncode == 0


def test_bind_hosts_given_explicitly_are_used(tmp_path):
    web, master = free_ports(2)
    # other loopback addresses: shows the explicit value is honoured without opening a public port
    process = start(tmp_path, "--master", "--web-host", "127.0.0.2", "--web-port", str(web),
                    "--master-bind-host", "127.0.0.3", "--master-bind-port", str(master))
    try:
        assert wait_listening(web, process) == {"127.0.0.2"}
        assert wait_listening(master, process) == {"127.0.0.3"}
    finally:
        interrupt(process)


def test_the_web_login_asks_for_the_password(tmp_path):
    (web,) = free_ports(1)
    password = "SENTINEL-pw-5c1e"
    process = start(tmp_path, "--web-port", str(web), "--web-login", "--web-user", "alice",
                    env={"LOCUST_WEB_PASSWORD": password})
    base = f"http://127.0.0.1:{web}"
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))

    def post_login(user: str, given: str) -> str:
        data = urllib.parse.urlencode({"username": user, "password": given}).encode()
        with opener.open(urllib.request.Request(f"{base}/hstu/login", data=data), timeout=10) as response:
            return urllib.parse.urlparse(response.geturl()).path

    try:
        wait_listening(web, process)
        for path in ("/", "/stats/requests", "/hstu/report.html", "/hstu/report.json", "/hstu/charts", "/hstu/tab.js"):
            with opener.open(base + path, timeout=10) as response:  # redirected to the login page
                assert urllib.parse.urlparse(response.geturl()).path == "/login", path
        assert post_login("alice", "wrong") == "/login"
        assert post_login("mallory", password) == "/login"
        assert post_login("alice", password) == "/"
        with opener.open(f"{base}/stats/requests", timeout=10) as response:
            assert json.loads(response.read())["state"] == "ready"
        with opener.open(f"{base}/", timeout=10) as response:
            assert password not in response.read().decode()
    finally:
        interrupt(process)
    assert password not in (tmp_path / "locust.log").read_text()


def test_a_login_without_a_password_is_refused_in_one_line(tmp_path):
    (web,) = free_ports(1)
    process = start(tmp_path, "--web-port", str(web), "--web-login")
    assert process.wait(60) == 2
    log = (tmp_path / "locust.log").read_text()
    assert "hstu-replay: error: --web-login needs --web-password" in log
    assert "Traceback" not in log


def test_conflicting_target_addresses_exit_2_before_any_load(tmp_path):
    process = start(tmp_path, "--headless", "--host", "grpc://127.0.0.1:1", "--triton-url", "127.0.0.1:2",
                    "--report-dir", str(tmp_path / "report"))
    assert process.wait(60) == 2
    log = (tmp_path / "locust.log").read_text()
    assert "hstu-replay: error: --host 'grpc://127.0.0.1:1' and --triton-url '127.0.0.1:2' name different targets" in log
    assert "Traceback" not in log and not (tmp_path / "report").exists()
