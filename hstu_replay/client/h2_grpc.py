"""Inference over gRPC as HTTP/2 on a plain socket (`--triton-grpc-transport h2`, the default).

A gRPC call is one HTTP/2 stream: HEADERS of a POST of `application/grpc` to the method's path,
DATA carrying one length-prefixed message, answered by HEADERS, DATA (one length-prefixed
message) and trailing HEADERS with `grpc-status` and `grpc-message`, or by HEADERS alone that
carry the status. The socket is a plain one, gevent's under Locust's monkey-patching, so a wait
yields to the other users without grpcio's threads and completion queue.

The HTTP/2 here is what one unary call at a time needs (RFC 9113): the preface and SETTINGS,
flow-control windows both ways (ours raised at the start so an answer is never stalled; the
request's DATA follows the server's, Triton announces 4 MiB), PING answered, GOAWAY and
RST_STREAM turned into errors (a stream the server says it never took is sent again once, on a
new connection), CONTINUATION and padding read, a frame longer than the 16,384 bytes our SETTINGS
allow refused (FRAME_SIZE_ERROR) and its connection dropped. Header blocks are HPACK by the `hpack` library:
ours never enters the dynamic table, so it is encoded once per transport; the server's are
decoded in order. The frames are written by hand because the `h2` library's state machine,
header checks and copies cost about 0.3 ms a call, as much as grpcio (BENCHMARKS.md, "Load
generator cost"); the tests check this module against an `h2` server end. The request goes out
with one `sendmsg` of the frame heads and the message's numpy pieces: header block and first
window in one write, nothing joined.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Sequence
from urllib.parse import unquote

import hpack
import numpy as np

from hstu_replay.client.grpc_message import (METHOD, STATUS_NAMES, Inputs, Message, RequestEncoder, decode_response,
                                             status_error)
from hstu_replay.client.http_infer import closed_by_peer, send_all
from hstu_replay.errors import ProtocolError, ServerError, ServerUnavailable

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 5, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
HEADER_TABLE_SIZE, ENABLE_PUSH, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x1, 0x2, 0x4, 0x5
REFUSED_STREAM = 0x7
DEFAULT_WINDOW, DEFAULT_FRAME = 65_535, 16_384  # until the server's SETTINGS say otherwise
# Our SETTINGS announce no MAX_FRAME_SIZE, so a frame the server sends is at most DEFAULT_FRAME long
# (RFC 9113 4.2): a longer one is a FRAME_SIZE_ERROR, and the connection is not read further.
WINDOW = 16 * 1024 * 1024  # our receive windows (connection and streams)
MAX_WINDOW = 2**31 - 1
_HEAD = struct.Struct(">HBBBL")  # 24-bit length (16 + 8), type, flags, stream id
_LAST_STREAM = 2**31 - 1 - 1024  # past this, a new connection (stream ids are never reused)
_IDLE_CHECK_S = 1.0  # a connection idle this long is checked for a close by the server before use
_READ = 256 * 1024
#: RST_STREAM's HTTP/2 error code -> the gRPC status (grpc/doc/PROTOCOL-HTTP2.md); others: INTERNAL
RESET_STATUS = {0x8: "CANCELLED", 0xB: "RESOURCE_EXHAUSTED", 0xC: "PERMISSION_DENIED"}
#: an answer's HTTP status other than 200 -> the gRPC status (grpc/doc/http-grpc-status-mapping.md)
HTTP_STATUS = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
               429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}


def frame_head(length: int, kind: int, flags: int, stream: int) -> bytes:
    return _HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream)


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack(">HL", k, v) for k, v in values.items())
    return frame_head(len(payload), SETTINGS, 0, 0) + payload


def window_update(stream: int, increment: int) -> bytes:
    return frame_head(4, WINDOW_UPDATE, 0, stream) + struct.pack(">L", increment)


#: what a new connection sends first: preface, our settings, the connection's window raised
OPENING = (PREFACE + settings_frame({ENABLE_PUSH: 0, INITIAL_WINDOW_SIZE: WINDOW})
           + window_update(0, WINDOW - DEFAULT_WINDOW))


class Refused(Exception):
    """The server did not take the request (GOAWAY below its stream, REFUSED_STREAM, closed before it
    went out): safe to send again."""


class H2Grpc:
    def __init__(self, host: str, port: int, model: str, headers: dict[str, str], timeout_s: float,
                 tls: ssl.SSLContext | None = None):
        self.address, self.timeout_s, self.tls = (host, port), timeout_s, tls
        self.block = request_block(host, port, tls is not None, timeout_s, headers)
        self._encoder = RequestEncoder(model, parts=True)
        self._conn: Connection | None = None
        self._used = 0.0  # when the connection last carried an answer

    def infer(self, inputs: Inputs, outputs: Sequence[str],
              extra: Sequence[tuple[str, str]] = ()) -> tuple[dict[str, np.ndarray], float]:
        """Send int64 `inputs` (name, contiguous pieces); returns the named outputs as arrays and
        the seconds from the request's first byte out to the answer's last byte in. `extra`: header
        fields of this request alone (a routing key), appended to the fixed block."""
        message = self._encoder.encode(inputs, outputs)
        block = self.block + header_fields(extra) if extra else self.block
        for attempt in (0, 1):
            conn = self._connection()
            start = time.monotonic()
            try:
                raw = conn.call(block, message, start + self.timeout_s)
                self._used = time.monotonic()
                if conn.going_away:
                    self.close()
                return decode_response(raw), self._used - start
            except Refused as exc:
                self.close()
                if attempt:
                    raise ServerUnavailable(f"UNAVAILABLE: {exc}") from None
            except (OSError, hpack.HPACKError) as exc:
                self.close()
                raise socket_error(exc) from None
            except ServerError:
                if conn.broken:
                    self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _connection(self) -> Connection:
        """The open connection, or a new one when there is none, the server closed it while it was
        idle, or it ran out of stream ids."""
        conn = self._conn
        if conn is not None and (conn.next_stream > _LAST_STREAM or (
                time.monotonic() - self._used > _IDLE_CHECK_S and closed_by_peer(conn.sock))):
            self.close()
        if self._conn is None:
            self._conn = Connection(self._connect())
        return self._conn

    def _connect(self) -> socket.socket:
        host, port = self.address
        try:
            sock = socket.create_connection(self.address, timeout=self.timeout_s)
        except OSError as exc:
            raise ServerUnavailable(f"UNAVAILABLE: cannot connect to {host}:{port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is None:
            return sock
        try:
            sock = self.tls.wrap_socket(sock, server_hostname=host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise ServerError(f"TLS handshake with {host}:{port} failed: {exc}") from None
        if sock.selected_alpn_protocol() != "h2":
            sock.close()
            raise ServerError(f"{host}:{port} did not agree to HTTP/2 over TLS (ALPN h2): not a gRPC server")
        return sock


def request_block(host: str, port: int, tls: bool, timeout_s: float, headers: dict[str, str]) -> bytes:
    """The request's HPACK header block. No field enters the dynamic table (never-indexed literals,
    or static entries), so the same bytes are right on every connection, for every call."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    fields = [(":method", "POST"), (":scheme", "https" if tls else "http"), (":path", METHOD),
              (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers"),
              ("grpc-timeout", grpc_timeout(timeout_s)), *headers.items()]
    return header_fields(fields)


def header_fields(fields: Sequence[tuple[str, str]]) -> bytes:
    """Never-indexed HPACK literals of `fields` (names in lower case): a block of them can be
    appended to another without touching the dynamic table."""
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(k.lower().encode(), v.encode()) for k, v in fields])


def grpc_timeout(seconds: float) -> str:
    """The `grpc-timeout` header's value: at most 8 digits and a unit (milliseconds, else seconds)."""
    ms = max(1, round(seconds * 1000))
    return f"{ms}m" if ms < 10**8 else f"{min(round(seconds), 10**8 - 1)}S"


class Connection:
    """One HTTP/2 connection carrying one call at a time."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.next_stream = 1
        self.going_away = False  # GOAWAY seen: no new streams on it
        self.broken = False  # in a state no further call can use
        self._opening = OPENING  # sent with the first call
        self._decoder = hpack.Decoder()
        self._buffer = bytearray()  # bytes read, not yet parsed
        self._send_window = DEFAULT_WINDOW  # the connection's, the server's to grant
        self._initial_window = DEFAULT_WINDOW  # each new stream's
        self._max_frame = DEFAULT_FRAME
        self._unacknowledged = 0  # DATA bytes received since our last connection WINDOW_UPDATE
        self._table_update = b""  # a dynamic table size update due at the start of our next block

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def call(self, block: bytes, message: Message, deadline: float) -> memoryview:
        """One unary call: HEADERS, the framed message as DATA within the server's windows, the answer."""
        stream = self.next_stream
        self.next_stream += 2
        call = Call(stream, self._initial_window)
        # not compressed, its length, the message
        body = Outgoing([b"\x00" + message.size.to_bytes(4, "big"), *message.parts], 5 + message.size)
        out = [self._opening, *self._headers(stream, self._table_update + block)]
        self._opening = self._table_update = b""
        out += self._data(call, body)
        try:
            send_all(self.sock, out)  # the header block and the first window in one write
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise Refused(f"the connection closed before the request went out: {exc}") from None
        while not call.ended:
            self._read(call, deadline)
            if body.left:
                more = self._data(call, body)
                if more:
                    send_all(self.sock, more)
        return call.result()

    def _headers(self, stream: int, block: bytes) -> list[bytes]:
        """HEADERS, and CONTINUATION frames when the block is longer than a frame."""
        frames, first = [], True
        while first or block:
            piece, block = block[:self._max_frame], block[self._max_frame:]
            flags = END_HEADERS if not block else 0
            frames += [frame_head(len(piece), HEADERS if first else CONTINUATION, flags, stream), piece]
            first = False
        return frames

    def _data(self, call: Call, body: Outgoing) -> list:
        """DATA frames for as much of the body as the windows allow (frame heads and slices)."""
        frames: list = []
        while body.left:
            size = min(self._send_window, call.send_window, self._max_frame, body.left)
            if size <= 0:
                break
            self._send_window -= size
            call.send_window -= size
            pieces = body.take(size)
            frames += [frame_head(size, DATA, END_STREAM if not body.left else 0, call.stream), *pieces]
        return frames

    def _read(self, call: Call, deadline: float) -> None:
        """Read once from the socket and act on every whole frame in hand."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer before the deadline")
        self.sock.settimeout(left)
        data = self.sock.recv(_READ)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        buffer = self._buffer
        buffer += data
        offset, replies = 0, []
        try:
            while len(buffer) - offset >= 9:
                high, low, kind, flags, stream = _HEAD.unpack_from(buffer, offset)
                length = high << 8 | low
                if length > DEFAULT_FRAME:
                    raise ProtocolError(f"INTERNAL: HTTP/2 FRAME_SIZE_ERROR: a frame of {length} bytes, "
                                        f"over the {DEFAULT_FRAME} this client's SETTINGS allow")
                end = offset + 9 + length
                if len(buffer) < end:
                    break
                payload = bytes(buffer[offset + 9:end])
                offset = end
                replies += self._frame(kind, flags, stream & 0x7FFFFFFF, payload, call)
        except ServerError:
            self.broken = True  # the frames after this one cannot be read
            raise
        del buffer[:offset]
        if replies:
            send_all(self.sock, replies)

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes, call: Call) -> list[bytes]:
        """Act on one frame; returns the frames to send in reply."""
        if kind == DATA:
            self._unacknowledged += len(payload)
            replies = []
            if self._unacknowledged >= WINDOW // 2:
                replies.append(window_update(0, self._unacknowledged))
                self._unacknowledged = 0
            if stream == call.stream:
                call.data(unpadded(payload, flags))
                call.received += len(payload)
                if call.received >= WINDOW // 2 and not flags & END_STREAM:
                    replies.append(window_update(stream, call.received))
                    call.received = 0
                call.ended |= bool(flags & END_STREAM)
            return replies
        if kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                payload = unpadded(payload, flags)
                payload = payload[5:] if flags & PRIORITY else payload
                call.pending, call.pending_end = bytearray(), bool(flags & END_STREAM)
            call.pending += payload
            if flags & END_HEADERS:
                fields = self._decoder.decode(bytes(call.pending), raw=True)  # every block, for the table
                if stream == call.stream:
                    call.fields(fields)
                    call.ended |= call.pending_end
            return []
        if kind == SETTINGS:
            if flags & ACK:
                return []
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack_from(">HL", payload, i)
                if key == INITIAL_WINDOW_SIZE:
                    call.send_window += value - self._initial_window
                    self._initial_window = value
                elif key == MAX_FRAME_SIZE:
                    self._max_frame = value
                elif key == HEADER_TABLE_SIZE and value < 4096:
                    self._table_update = b"\x20"  # our block indexes nothing: a table of size 0 serves
            return [frame_head(0, SETTINGS, ACK, 0)]
        if kind == PING:
            return [] if flags & ACK else [frame_head(8, PING, ACK, 0), payload]
        if kind == WINDOW_UPDATE:
            increment = struct.unpack(">L", payload[:4])[0] & 0x7FFFFFFF
            if stream == 0:
                self._send_window = min(self._send_window + increment, MAX_WINDOW)
            elif stream == call.stream:
                call.send_window = min(call.send_window + increment, MAX_WINDOW)
            return []
        if kind == RST_STREAM and stream == call.stream:
            code = struct.unpack(">L", payload[:4])[0]
            if code == REFUSED_STREAM:
                raise Refused("the server refused the stream (REFUSED_STREAM)")
            call.reset(code)
            return []
        if kind == GOAWAY:
            last, code = struct.unpack(">LL", payload[:8])
            self.going_away = True
            if (last & 0x7FFFFFFF) < call.stream:
                raise Refused(f"the server is going away (GOAWAY, error code {code})")
            return []
        if kind == PUSH_PROMISE:
            raise ServerError("INTERNAL: the server pushed a stream although push is off")
        return []  # PRIORITY, unknown kinds: nothing to do


def unpadded(payload: bytes, flags: int) -> bytes:
    if not flags & PADDED:
        return payload
    pad = payload[0] if payload else 0
    if pad >= len(payload):
        raise ServerError("INTERNAL: a frame's padding is longer than the frame")
    return payload[1:len(payload) - pad]


class Outgoing:
    """The request's body as buffers (`size` bytes in all), handed out in slices of a given size."""

    def __init__(self, buffers: list, size: int):
        self._buffers = buffers
        self.left = size
        self._index = 0
        self._offset = 0

    def take(self, size: int) -> list:
        if size == self.left and self._offset == 0:  # the rest, whole: as it is (the usual case)
            self.left = 0
            return self._buffers[self._index:]
        pieces = []
        self.left -= size
        while size:
            view = memoryview(self._buffers[self._index]).cast("B")
            piece = view[self._offset:self._offset + size]
            pieces.append(piece)
            size -= len(piece)
            self._offset += len(piece)
            if self._offset == len(view):
                self._index, self._offset = self._index + 1, 0
        return pieces


class Call:
    """What one stream's answer has brought so far."""

    def __init__(self, stream: int, send_window: int):
        self.stream = stream
        self.send_window = send_window
        self.ended = False
        self.received = 0  # DATA bytes since our last WINDOW_UPDATE of the stream
        self.pending, self.pending_end = bytearray(), False  # a header block arriving in pieces
        self.status: str | None = None  # the gRPC status, by name
        self.details = ""
        self.http_status = b""
        self.body = bytearray()

    def data(self, payload: bytes) -> None:
        self.body += payload

    def fields(self, fields) -> None:
        for name, value in fields:
            if name == b":status":
                self.http_status = value
            elif name == b"grpc-status":
                code = int(value) if value.isdigit() else -1
                self.status = STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"
            elif name == b"grpc-message":
                self.details = unquote(value.decode("utf-8", "replace"))

    def reset(self, code: int) -> None:
        self.ended = True
        self.status = RESET_STATUS.get(code, "INTERNAL")
        self.details = f"stream reset by the server (HTTP/2 error code {code})"
        self.http_status = self.http_status or b"200"

    def result(self) -> bytes:
        """The answer's message; raises the error its status says."""
        if self.http_status != b"200":
            code = HTTP_STATUS.get(int(self.http_status) if self.http_status.isdigit() else 0, "UNKNOWN")
            raise status_error(code, f"HTTP status {self.http_status.decode(errors='replace') or 'missing'}")
        if self.status is None:
            raise ServerError("INTERNAL: the answer ended without a grpc-status")
        if self.status != "OK":
            raise status_error(self.status, self.details)
        body = self.body
        if len(body) < 5:
            raise ServerError(f"INTERNAL: the answer carried {len(body)} bytes, not a gRPC message")
        if body[0] != 0:
            raise ServerError("INTERNAL: the answer is compressed, and none was asked for")
        size = int.from_bytes(body[1:5], "big")
        if len(body) != 5 + size:
            raise ServerError(f"INTERNAL: the answer's message says {size} bytes, {len(body) - 5} came")
        return memoryview(body)[5:]


def socket_error(exc: Exception) -> ServerError:
    """A failed connection as grpcio reports it: UNAVAILABLE, or DEADLINE_EXCEEDED for a timeout."""
    if isinstance(exc, TimeoutError):
        return ServerError(f"DEADLINE_EXCEEDED: {exc}")
    if isinstance(exc, ConnectionError):
        return ServerUnavailable(f"UNAVAILABLE: connection lost: {exc}")
    return ServerError(f"INTERNAL: {type(exc).__name__}: {exc}")
