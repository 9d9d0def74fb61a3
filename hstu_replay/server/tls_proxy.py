"""HTTPS in front of Triton's HTTP port: a small TLS-terminating forwarder.

Triton's HTTP endpoint has no TLS of its own; deployments put a TLS proxy in front of it. This
is that shape on one host: each TLS connection accepted on `listen` is decrypted and its bytes
are copied, both ways, to a plain connection to Triton's HTTP port. The answers are the real
server's; nothing of the traffic is parsed, logged or kept.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
from dataclasses import dataclass

_HANDSHAKE_TIMEOUT_S = 10.0
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class TlsFiles:
    """PEM server certificate (chain) and private key."""

    cert: str
    key: str

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.set_alpn_protocols(["http/1.1"])
        return context


class TlsForwarder:
    """Accepts TLS on (host, port) and forwards each connection to `upstream` in plain TCP."""

    def __init__(self, host: str, port: int, upstream: tuple[str, int], files: TlsFiles):
        self.upstream = upstream
        self._context = files.server_context()
        self._listener = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="https-accept", daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._acceptor.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(client,), name="https-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        """Handshake (a client that fails it is dropped: its TLS library reports why), then copy."""
        try:
            client.settimeout(_HANDSHAKE_TIMEOUT_S)
            tls = self._context.wrap_socket(client, server_side=True)
            tls.settimeout(None)
        except OSError:  # ssl.SSLError included
            client.close()
            return
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            tls.close()
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tls.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _pump(tls, upstream)

    def __enter__(self) -> TlsForwarder:
        return self

    def __exit__(self, *_) -> None:
        self.close()


def _pump(tls: ssl.SSLSocket, plain: socket.socket) -> None:
    """Copy bytes both ways until either end closes, from one thread: an SSL connection must
    not be read and written by two threads at once."""
    poller = select.poll()
    for sock in (tls, plain):
        poller.register(sock, select.POLLIN)
    try:
        while True:
            if tls.pending():  # decrypted bytes already buffered need no wait
                readable = {tls.fileno()}
            else:
                readable = {fd for fd, _ in poller.poll()}
            for source, sink in ((tls, plain), (plain, tls)):
                if source.fileno() in readable:
                    data = source.recv(_CHUNK)
                    if not data:
                        return
                    sink.sendall(data)
    except OSError:  # ssl.SSLError included: a reset or a client gone mid-record ends the connection
        pass
    finally:
        for sock in (tls, plain):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
