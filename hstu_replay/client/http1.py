"""Reading an HTTP/1.1 response strictly (RFC 9112): what is not one is a `ProtocolError`.

- the status line is `HTTP/1.x SP 3DIGIT SP reason` (the reason may be empty);
- each header field is `token ":" OWS value OWS`: no space before the colon, no obs-fold (a
  line starting with a space or tab), no control characters, no CR or LF but as a line's CRLF;
- the body is framed by one Content-Length (repeats allowed only when equal) or by chunked
  transfer coding (chunk-size lines with optional extensions, each chunk's data followed by CRLF,
  the trailer section read as header fields); both at once, another transfer coding or neither
  (on a status that has a body) is refused;
- bounds on the status line, the number of fields, the header block and the body.

The header block is found with one `find` and checked with one compiled pattern for the status
line and one for all its field lines (line by line only to name a fault), so a response of a few
fields costs a handful of C calls: no loop in Python goes over its bytes. Interim 1xx responses
(other than 101, which nobody asked for) are read and skipped, as RFC 9110 15.2 asks of a
client, up to INTERIM_LIMIT of them.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from hstu_replay.errors import ProtocolError, ServerUnavailable

STATUS_LINE_LIMIT = 1024  # bytes of a status line; Triton's are about 20
FIELD_COUNT_LIMIT = 100  # header fields in one response (and fields in one chunked trailer section)
HEAD_LIMIT = 64 * 1024  # bytes of a response head (and of a chunked trailer section)
BODY_LIMIT = 256 * 1024 * 1024  # bytes of a response body: an inference answer is far smaller
CHUNK_LINE_LIMIT = 1024  # bytes of a chunk-size line, extensions included
INTERIM_LIMIT = 10  # interim (1xx) responses before the final one
_READ = 65536
_NO_BODY = (204, 304)  # statuses that never carry a body (no 1xx reaches the framing)

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_VCHARS = rb"[!-~\x80-\xff]+"
_FIELD = _TOKEN + rb":[ \t]*(?:" + _VCHARS + rb"(?:[ \t]+" + _VCHARS + rb")*)?[ \t]*"
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3}) [\t !-~\x80-\xff]*")
_FIELD_LINE = re.compile(_FIELD)
_FIELD_LINES = re.compile(rb"(?:\r\n" + _FIELD + rb")*")  # every field of a head in one match
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t !-~\x80-\xff])*"'
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN
                         + rb"|" + _QUOTED + rb"))?)*")
_VERSION_START = b"HTTP/1."


@dataclass(slots=True)
class Head:
    """A response's status line and header fields, checked, with how its body is framed."""

    status: int
    fields: dict[str, str]  # lower-case names; a repeated field's values joined by ", "
    length: int | None  # the body's bytes; None: chunked
    close: bool  # the server closes the connection after this response


def fail(what: str) -> ProtocolError:
    return ProtocolError(f"HTTP/1.1 protocol error: {what}")


def _shown(data: bytes) -> str:
    return repr(bytes(data[:24]))


def parse_head(block: bytes) -> Head:
    """A response head without its final CRLF CRLF: the status line and each field line checked."""
    first = block.find(b"\r\n")
    first = len(block) if first < 0 else first
    if first > STATUS_LINE_LIMIT:
        raise fail(f"a status line of {first} bytes (at most {STATUS_LINE_LIMIT})")
    match = _STATUS_LINE.fullmatch(block, 0, first)
    if match is None:
        if b"\r" in block[:first] or b"\n" in block[:first]:
            raise fail("a bare CR or LF in the status line")
        raise fail(f"the status line is not HTTP/1.x SP 3DIGIT SP reason: {_shown(block[:first])}")
    if (count := block.count(b"\r\n")) > FIELD_COUNT_LIMIT:
        raise fail(f"{count} header fields (at most {FIELD_COUNT_LIMIT})")
    fields = parse_fields(block, first, "header")
    status = int(match[2])
    connection = fields.get("connection")
    tokens = {t.strip().lower() for t in connection.split(",")} if connection else ()
    close = "close" in tokens or (match[1] == b"0" and "keep-alive" not in tokens)
    return Head(status, fields, None if 100 <= status < 200 else _length(status, fields), close)


def parse_fields(block: bytes, start: int, where: str) -> dict[str, str]:
    """`block[start:]`, a CRLF before each field line, -> lower-case name: value (OWS stripped;
    repeats joined by ", "). Checked with one match; only a block that fails it is looked at line by line."""
    if _FIELD_LINES.fullmatch(block, start) is None:
        raise _field_fault(block[start:].split(b"\r\n")[1:], where)
    fields: dict[str, str] = {}
    for line in block[start:].decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        name, value = name.lower(), value.strip(" \t")
        fields[name] = f"{fields[name]}, {value}" if name in fields else value
    return fields


def _field_fault(lines: list[bytes], where: str) -> ProtocolError:
    """The first field line of `lines` that breaks the syntax, named."""
    for line in lines:
        if b"\r" in line or b"\n" in line:
            return fail(f"a bare CR or LF in a {where} field")
        if _FIELD_LINE.fullmatch(line) is None:
            if line[:1] in (b" ", b"\t"):
                return fail(f"a folded {where} line (obs-fold): {_shown(line)}")
            return fail(f"a {where} field that is not token \":\" value: {_shown(line)}")
    raise AssertionError("no faulty field line")


def _length(status: int, fields: dict[str, str]) -> int | None:
    """The body's framing (RFC 9112 6.3): its length, or None for chunked."""
    coding = fields.get("transfer-encoding")
    lengths = fields.get("content-length")
    if coding is not None:
        if lengths is not None:
            raise fail("both Transfer-Encoding and Content-Length")
        if [c.strip().lower() for c in coding.split(",")] != ["chunked"]:
            raise fail(f"Transfer-Encoding {coding[:40]!r}: only chunked is read")
        return None
    if lengths is None:
        if status in _NO_BODY:
            return 0
        raise fail("neither Content-Length nor chunked")
    if lengths.isdigit() and lengths.isascii():  # the usual case: one length
        values = {lengths}
    else:
        values = {v.strip() for v in lengths.split(",")}
    if len(values) != 1:
        raise fail(f"differing Content-Lengths {lengths[:40]!r}")
    (value,) = values
    if not (value.isascii() and value.isdigit()):
        raise fail(f"Content-Length {value[:40]!r} is not a number")
    length = int(value)
    if length > BODY_LIMIT:
        raise fail(f"a body of {length} bytes (at most {BODY_LIMIT})")
    return length


def read_response(sock: socket.socket, data: bytearray) -> tuple[Head, memoryview, bytes]:
    """One response from `sock`, `data` holding what was read already; returns its head, its body
    and the bytes read past its end. Raises ProtocolError for anything not HTTP/1.1, and
    ServerUnavailable when the connection closes before the response is whole."""
    for _ in range(INTERIM_LIMIT + 1):
        end = _head_end(sock, data)
        head = parse_head(bytes(data[:end]))
        del data[: end + 4]
        if head.status == 101:
            raise fail("101 Switching Protocols, and no upgrade was asked for")
        if head.status >= 200:
            break  # 1xx: interim, the final response follows
    else:
        raise fail(f"more than {INTERIM_LIMIT} interim (1xx) responses")
    if head.length is None:
        body, extra = _read_chunked(sock, data)
    else:
        body, extra = _read_sized(sock, data, head.length)
    return head, memoryview(body), extra


def _head_end(sock: socket.socket, data: bytearray) -> int:
    """Where the head's CRLF CRLF starts, reading until it is in `data` (bounded, and failing as
    soon as the first bytes cannot start a status line)."""
    end = data.find(b"\r\n\r\n")
    while end < 0:
        start = bytes(data[:len(_VERSION_START)])
        if not _VERSION_START.startswith(start) and not start.startswith(_VERSION_START):
            raise fail(f"the response does not start with {_VERSION_START.decode()}: {_shown(data)}")
        if data.find(b"\r\n", 0, STATUS_LINE_LIMIT + 2) < 0 and len(data) > STATUS_LINE_LIMIT + 1:
            raise fail(f"no end of the status line within {STATUS_LINE_LIMIT} bytes")
        if len(data) > HEAD_LIMIT:
            raise fail(f"a response head longer than {HEAD_LIMIT} bytes")
        seen = len(data)
        data += _recv(sock, "before a response" if not seen else "in the middle of a response head")
        end = data.find(b"\r\n\r\n", max(seen - 3, 0))
    if end > HEAD_LIMIT:
        raise fail(f"a response head longer than {HEAD_LIMIT} bytes")
    return end


def _read_sized(sock: socket.socket, data: bytearray, size: int) -> tuple[bytearray, bytes]:
    """A body of `size` bytes, read into one buffer of that size."""
    body = bytearray(size)
    have = min(len(data), size)
    body[:have] = data[:have]
    extra = bytes(data[size:])
    view = memoryview(body)
    while have < size:
        got = sock.recv_into(view[have:], size - have)
        if not got:
            raise ServerUnavailable("connection closed in the middle of a response")
        have += got
    return body, extra


def _read_chunked(sock: socket.socket, buffer: bytearray) -> tuple[bytearray, bytes]:
    """A chunked body (RFC 9112 7.1) and its trailer section (checked, dropped); returns the body
    and what was read past it."""
    body = bytearray()
    while True:
        line = _line(sock, buffer, CHUNK_LINE_LIMIT, "chunk-size line")
        match = _CHUNK_LINE.fullmatch(line)
        if match is None:
            raise fail(f"a chunk-size line that is not hex digits and extensions: {_shown(line)}")
        size = int(match[1], 16)
        if len(body) + size > BODY_LIMIT:
            raise fail(f"a chunked body of more than {BODY_LIMIT} bytes")
        if size == 0:
            break
        while len(buffer) < size + 2:
            buffer += _recv(sock, "in the middle of a chunk", max(_READ, size + 2 - len(buffer)))
        if buffer[size:size + 2] != b"\r\n":
            raise fail(f"chunk data of {size} bytes not followed by CRLF")
        body += memoryview(buffer)[:size]
        del buffer[: size + 2]
    trailers, total = [], 0
    while line := _line(sock, buffer, HEAD_LIMIT - total, "trailer line"):
        trailers.append(line)
        total += len(line) + 2
        if len(trailers) > FIELD_COUNT_LIMIT:
            raise fail(f"more than {FIELD_COUNT_LIMIT} trailer fields")
    parse_fields(b"".join(b"\r\n" + t for t in trailers), 0, "trailer")
    return body, bytes(buffer)


def _line(sock: socket.socket, buffer: bytearray, limit: int, what: str) -> bytes:
    """The next line of `buffer` without its CRLF (reading as needed; at most `limit` bytes)."""
    while (eol := buffer.find(b"\r\n", 0, limit + 2)) < 0:
        if len(buffer) > limit + 1:
            raise fail(f"no end of a {what} within {limit} bytes")
        buffer += _recv(sock, f"in the middle of a {what}")
    line = bytes(buffer[:eol])
    if b"\r" in line or b"\n" in line:
        raise fail(f"a bare CR or LF in a {what}")
    del buffer[: eol + 2]
    return line


def _recv(sock: socket.socket, where: str, size: int = _READ) -> bytes:
    chunk = sock.recv(size)
    if not chunk:
        raise ServerUnavailable(f"connection closed {where}")
    return chunk
