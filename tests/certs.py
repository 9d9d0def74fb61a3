"""Certificates made in the test with the openssl CLI: a private CA, a server certificate it
signs for 127.0.0.1 / ::1 / localhost, and a second CA that signed nothing (the wrong one); and
`secure`, the one TLS server of a test session (a plugin of tests/conftest.py)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA that signed `cert`
    cert: Path  # server certificate
    key: Path  # its private key
    other_ca: Path  # a CA that did not sign `cert`


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(root: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=root)


def make_certs(root: Path) -> Certs:
    root.mkdir(parents=True, exist_ok=True)
    _ca(root, "test-ca")
    _ca(root, "other-ca")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-sha256", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=root)
    (root / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "test-ca.pem", "-CAkey", "test-ca.key", "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", "server.ext", "-out", "server.pem", cwd=root)
    return Certs(root / "test-ca.pem", root / "server.pem", root / "server.key", root / "other-ca.pem")


SENTINEL = "sentinel-7f3a9c1e-never-logged"  # the required header's value: must appear in no log or report
HEADER = "x-api-key"


@dataclass(frozen=True)
class SecureServer:
    """The reference target with gRPC TLS, HTTPS in front of its HTTP port and a required header."""

    handle: object  # hstu_replay.process.ServerProcess
    https_port: int
    certs: Certs

    @property
    def grpc_url(self) -> str:
        return self.handle.grpc_url

    @property
    def https_url(self) -> str:
        return f"127.0.0.1:{self.https_port}"

    def url(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.https_url

    @staticmethod
    def headers(protocol: str, value: str = SENTINEL) -> dict[str, str]:
        """What a client sends: Triton checks a gRPC restriction's header under its own prefix."""
        return {("triton-grpc-protocol-" if protocol == "grpc" else "") + HEADER: value}


def start_secure_server(repository: Path, root: Path) -> SecureServer:
    from tests.conftest import free_ports, start_server

    certs = make_certs(root / "certs")
    (https,) = free_ports(1)
    handle = start_server(repository, root / "server.log", "--tls-cert", str(certs.cert), "--tls-key", str(certs.key),
                          "--https-port", str(https), "--require-header", f"{HEADER}={SENTINEL}")
    return SecureServer(handle, https, certs)


@pytest.fixture(scope="session")
def secure(compiled_repository, tmp_path_factory):
    """The reference target served with TLS and a required header; its log never shows the header's value."""
    from tests.conftest import stop_server

    server = start_secure_server(compiled_repository, tmp_path_factory.mktemp("secure"))
    yield server
    assert stop_server(server.handle) == 0
    assert SENTINEL not in server.handle.log.read_text(errors="replace")
