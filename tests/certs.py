"""Certificates made in the test with the openssl CLI: a private CA, a server certificate it
signs for 127.0.0.1 / ::1 / localhost, and a second CA that signed nothing (the wrong one)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


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
