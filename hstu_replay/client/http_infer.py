"""Inference over HTTP/1.1 with Triton's binary tensor extension, sent from the request's buffers.

A request is a short head, a small JSON inference header, then each input's raw bytes
(`Inference-Header-Content-Length` says where the JSON ends). The bytes go out with one
`sendmsg` straight from the numpy pieces the request was laid out from: nothing is joined or
copied in Python (BENCHMARKS.md, "Load generator cost", has the measurements against
tritonclient.http and geventhttpclient, which build the body as one bytes object first). The
response is read strictly (`http1`: what is not HTTP/1.1 is a ProtocolError, after which the
connection is dropped and made again) into one buffer of its announced size, and its outputs are
numpy views of it.

One keep-alive connection, used by one Locust user at a time. Under Locust's monkey-patching
the socket is gevent's, so a wait yields to the other users.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Sequence
from urllib.parse import quote

import numpy as np
import orjson

from hstu_replay.client.http1 import Head, fail, read_response
from hstu_replay.errors import AccessDenied, ServerError, ServerUnavailable

#: Triton datatype -> numpy dtype, for the outputs the HSTU models return.
DTYPES = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8"), "INT32": np.dtype("<i4"), "FP16": np.dtype("<f2")}
_IDLE_CHECK_S = 1.0  # a connection idle this long is checked for a close by the server before use
_IOV_MAX = 512  # buffers per sendmsg call (Linux allows 1024)
_TLS_WRITE = 64 * 1024  # through TLS, buffers smaller than this are gathered into writes of this size


class HttpInfer:
    def __init__(self, host: str, port: int, model: str, headers: dict[str, str], timeout_s: float,
                 tls: ssl.SSLContext | None = None):
        self.address, self.timeout_s, self.tls = (host, port), timeout_s, tls
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 literals in brackets
        self._head = (f"POST /v2/models/{quote(model, safe='')}/infer HTTP/1.1\r\nHost: {authority}\r\n"
                      f"Content-Type: application/octet-stream\r\n{extra}")
        self._outputs: dict[tuple[str, ...], list[dict]] = {}
        self._sock: socket.socket | None = None
        self._used = 0.0  # when the connection last carried a response

    def infer(self, inputs: Sequence[tuple[str, tuple[np.ndarray, ...]]], outputs: Sequence[str],
              extra: Sequence[tuple[str, str]] = ()) -> tuple[dict[str, np.ndarray], float]:
        """Send int64 `inputs` (name, contiguous pieces); returns the named outputs as arrays and
        the seconds from the first byte sent to the last byte received. `extra`: header fields of
        this request alone (a routing key)."""
        buffers, specs, size = [], [], 0
        for name, parts in inputs:
            nbytes = 0
            for p in parts:
                if p.nbytes:
                    buffers.append(p)
                    nbytes += p.nbytes
            specs.append({"name": name, "shape": [nbytes // 8], "datatype": "INT64",
                          "parameters": {"binary_data_size": nbytes}})
            size += nbytes
        wanted = self._outputs.get(tuple(outputs))
        if wanted is None:
            wanted = self._outputs[tuple(outputs)] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
        header = orjson.dumps({"inputs": specs, "outputs": wanted})
        fields = "".join(f"{k}: {v}\r\n" for k, v in extra)
        head = (f"{self._head}{fields}Inference-Header-Content-Length: {len(header)}\r\n"
                f"Content-Length: {len(header) + size}\r\n\r\n").encode("latin-1")
        start = time.monotonic()
        sock = self._send([head, header, *buffers])
        try:
            head, body = self._receive(sock)
        except OSError as exc:
            self.close()  # the connection is in an unknown state
            raise _socket_error(exc) from None
        except ServerError:
            self.close()
            raise
        self._used = time.monotonic()
        seconds = self._used - start
        if head.close:
            self.close()
        if head.status != 200:
            raise _error(head.status, body)
        return _outputs(head.fields, body), seconds

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    # -- connection --------------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as exc:
            raise ServerUnavailable(f"cannot connect to {self.address[0]}:{self.address[1]}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=self.address[0])
            except (OSError, ssl.SSLError) as exc:
                sock.close()
                raise ServerError(f"TLS handshake with {self.address[0]}:{self.address[1]} failed: {exc}") from None
        return sock

    def _send(self, buffers: list) -> socket.socket:
        """Send on the open connection; when a kept-alive connection turns out closed before
        the request went out whole, the server cannot have taken it: send once more on a new one."""
        if self._sock is not None and time.monotonic() - self._used > _IDLE_CHECK_S and closed_by_peer(self._sock):
            self.close()
        reused = self._sock is not None
        for attempt in (0, 1):
            if self._sock is None:
                self._sock = self._connect()
            try:
                send_all(self._sock, list(buffers))
                return self._sock
            except OSError as exc:
                self.close()
                if attempt or not reused or not isinstance(exc, (ConnectionResetError, BrokenPipeError)):
                    raise _socket_error(exc) from None
        raise AssertionError("unreachable")

    def _receive(self, sock: socket.socket) -> tuple[Head, memoryview]:
        """One response, checked by `read_response` (strict HTTP/1.1): its head and body. With one
        request in flight, bytes past the response mean its framing was wrong, and RFC 9112 6.3
        forbids reading them as a response of their own: the response is refused."""
        head, body, extra = read_response(sock, bytearray())
        if extra:
            raise fail(f"{len(extra)} bytes past the end of a response that announced {len(body)}")
        return head, body


def send_all(sock: socket.socket, buffers: list) -> None:
    if isinstance(sock, ssl.SSLSocket):  # no scatter-gather through TLS
        _send_tls(sock, buffers)
        return
    while buffers:
        sent = sock.sendmsg(buffers[:_IOV_MAX])
        while sent and buffers:  # drop what went out; continue from inside a partly sent buffer
            size = memoryview(buffers[0]).nbytes
            if sent >= size:
                sent -= size
                del buffers[0]
            else:
                buffers[0], sent = memoryview(buffers[0]).cast("B")[sent:], 0


def _send_tls(sock: ssl.SSLSocket, buffers: list) -> None:
    """Through TLS each write is at least one record and one system call, and encryption copies
    every byte anyway: small buffers are gathered into writes of `_TLS_WRITE` bytes, large ones
    go as they are."""
    gathered = bytearray()
    for b in buffers:
        view = memoryview(b).cast("B")
        if len(view) >= _TLS_WRITE:
            if gathered:
                sock.sendall(gathered)
                gathered = bytearray()
            sock.sendall(view)
            continue
        gathered += view
        if len(gathered) >= _TLS_WRITE:
            sock.sendall(gathered)
            gathered = bytearray()
    if gathered:
        sock.sendall(gathered)


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection was closed from the other end (readable with no data)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and not sock.recv(1, socket.MSG_PEEK)
    except (OSError, ValueError):
        return True


def _outputs(fields: dict[str, str], body: memoryview) -> dict[str, np.ndarray]:
    """The outputs of a binary-extension response: JSON header, then each output's bytes."""
    try:
        json_size = int(fields.get("inference-header-content-length", len(body)))
        header = orjson.loads(body[:json_size])
        out, offset = {}, json_size
        for spec in header["outputs"]:
            dtype = DTYPES[spec["datatype"]]
            shape = tuple(int(d) for d in spec["shape"])
            size = spec.get("parameters", {}).get("binary_data_size")
            if size is None:  # sent as JSON numbers
                out[spec["name"]] = np.asarray(spec["data"], dtype=dtype).reshape(shape)
                continue
            out[spec["name"]] = np.frombuffer(body, dtype=dtype, count=size // dtype.itemsize, offset=offset).reshape(shape)
            offset += size
        return out
    except (KeyError, ValueError, TypeError, orjson.JSONDecodeError) as exc:
        raise ServerError(f"malformed inference response: {type(exc).__name__}: {exc}") from None


def _error(status: int, body: memoryview) -> Exception:
    try:
        message = str(orjson.loads(body)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = bytes(body[:200]).decode("utf-8", "replace")
    if status == 503 or "unknown model" in message:  # not there to take it (yet)
        return ServerUnavailable(f"HTTP {status}: {message}")
    if status in (401, 403):  # Triton's restricted APIs answer 403; an authenticating proxy 401 or 403
        return AccessDenied(f"HTTP {status}: {message}")
    return ServerError(f"HTTP {status}: {message}")


def _socket_error(exc: OSError) -> Exception:
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)):
        return ServerUnavailable(f"connection lost: {exc}")
    if isinstance(exc, TimeoutError):
        return ServerError(f"timed out: {exc}")
    return ServerError(f"{type(exc).__name__}: {exc}")
