"""The HTTPS forwarder on its own: TLS in, the same bytes out to a plain upstream and back."""

from __future__ import annotations

import os
import socket
import ssl
import threading

import pytest

from hstu_replay.process import free_ports
from hstu_replay.server.tls_proxy import TlsFiles, TlsForwarder
from tests.certs import make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


class Reverser:
    """A plain TCP upstream that answers each message with its bytes reversed (not an echo: a
    forwarder that looped the client's own bytes back would not pass)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                size = int.from_bytes(_read(conn, 8), "big")
                conn.sendall(_read(conn, size)[::-1])


def _read(sock, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed early")
        data += chunk
    return bytes(data)


def _client_context(ca) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def test_bytes_go_through_both_ways_unchanged(certs):
    upstream = Reverser()
    (port,) = free_ports(1)
    payload = os.urandom(3 * 1024 * 1024 + 17)  # several TLS records and socket buffers each way
    with TlsForwarder("127.0.0.1", port, ("127.0.0.1", upstream.port), TlsFiles(str(certs.cert), str(certs.key))):
        for host in ("127.0.0.1", "localhost"):
            with socket.create_connection(("127.0.0.1", port)) as raw, \
                    _client_context(certs.ca).wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(len(payload).to_bytes(8, "big") + payload)
                assert _read(tls, len(payload)) == payload[::-1]
                assert tls.recv(1) == b""  # the upstream closed: so does the forwarder
    upstream.sock.close()


def test_a_client_that_does_not_trust_the_certificate_gets_nothing_through(certs):
    upstream = Reverser()
    (port,) = free_ports(1)
    with TlsForwarder("127.0.0.1", port, ("127.0.0.1", upstream.port), TlsFiles(str(certs.cert), str(certs.key))):
        with socket.create_connection(("127.0.0.1", port)) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                _client_context(certs.other_ca).wrap_socket(raw, server_hostname="127.0.0.1")
    upstream.sock.close()


def test_once_closed_the_port_is_free_again(certs):
    (port,) = free_ports(1)
    TlsForwarder("127.0.0.1", port, ("127.0.0.1", 9), TlsFiles(str(certs.cert), str(certs.key))).close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
