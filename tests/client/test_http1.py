"""The strict HTTP/1.1 response reader, fed hand-written bytes: one valid and one invalid case per
rule of RFC 9112 it enforces, the bounds, and the same response split at every point."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hstu_replay.client.http1 import (BODY_LIMIT, CHUNK_LINE_LIMIT, FIELD_COUNT_LIMIT, HEAD_LIMIT, INTERIM_LIMIT,
                                      STATUS_LINE_LIMIT, parse_head, read_response)
from hstu_replay.errors import ProtocolError, ServerUnavailable


class Pieces:
    """A socket's receiving end that hands out the given pieces, one per call, then end of stream."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = [p for p in pieces if p]

    def recv(self, size: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > size:
            piece, rest = piece[:size], piece[size:]
            self.pieces.insert(0, rest)
        return piece

    def recv_into(self, view, size: int) -> int:
        piece = self.recv(min(size, len(view)))
        view[:len(piece)] = piece
        return len(piece)


def read(raw: bytes, *more: bytes):
    """(head, body bytes, bytes read past the response)"""
    head, body, extra = read_response(Pieces([raw, *more]), bytearray())
    return head, bytes(body), extra


def refused(raw: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        read(raw)


SIZED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\nhello"
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"3;name=value;quoted=\"a \\\" b\"\r\nhel\r\n2\r\nlo\r\n0\r\nGrpc-Whatever: x\r\n\r\n")


def test_a_sized_response_gives_status_fields_body_and_what_follows():
    head, body, extra = read(SIZED + b"HTTP/1.1")
    assert head.status == 200 and body == b"hello" and extra == b"HTTP/1.1"
    assert head.fields == {"content-type": "application/json", "content-length": "5"}
    assert not head.close


def test_a_chunked_response_with_extensions_and_trailers_is_read_whole():
    _, body, extra = read(CHUNKED)
    assert body == b"hello" and extra == b""


# -- the status line -----------------------------------------------------------------------------

@pytest.mark.parametrize("line, status", [(b"HTTP/1.1 200 OK", 200), (b"HTTP/1.0 404 Not Found", 404),
                                          (b"HTTP/1.1 503 ", 503), (b"HTTP/1.1 200 \xe9t\xe9\tok", 200)])
def test_a_status_line_of_version_code_and_reason_is_read(line, status):
    assert parse_head(line + b"\r\nContent-Length: 0").status == status


@pytest.mark.parametrize("line", [
    b"\x00junk1234HTTP/1.1 200 OK",  # junk before the status line (what was once taken as 200)
    b"HTTP/2 200 OK", b"HTTP/1.1 200", b"HTTP/1.1  200 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK",
    b"http/1.1 200 OK", b"HTTP/1.x 200 OK", b"HTTP/1.1 200 O\x00K", b"ICY 200 OK", b""])
def test_anything_else_as_a_status_line_is_refused(line):
    refused(line + b"\r\nContent-Length: 0\r\n\r\n", "status line")


def test_junk_before_a_response_is_refused_before_its_head_is_whole():
    """The first bytes already cannot start a status line: no waiting for a CRLF CRLF that may never come."""
    with pytest.raises(ProtocolError, match="does not start with HTTP/1"):
        read_response(Pieces([b"\x17\x03\x03junk", b"more junk"]), bytearray())


def test_a_status_line_over_its_bound_is_refused():
    line = b"HTTP/1.1 200 " + b"x" * (STATUS_LINE_LIMIT - 13)
    assert parse_head(line + b"\r\nContent-Length: 0").status == 200
    refused(line + b"x\r\nContent-Length: 0\r\n\r\n", "status line of")
    with pytest.raises(ProtocolError, match="no end of the status line"):  # without waiting for the rest
        read_response(Pieces([line + b"xx"]), bytearray())


# -- header fields --------------------------------------------------------------------------------

@pytest.mark.parametrize("field, name, value", [
    (b"A: b", "a", "b"), (b"A:b", "a", "b"), (b"A: \t b c \t", "a", "b c"), (b"A:", "a", ""),
    (b"X-Odd!#$%&'*+.^_`|~9: v\x80\xff", "x-odd!#$%&'*+.^_`|~9", "v\x80\xff")])
def test_a_field_is_token_colon_optional_whitespace_value(field, name, value):
    assert parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + field).fields[name] == value


@pytest.mark.parametrize("field, match", [
    (b"A : b", "not token"), (b" A: b", "obs-fold"), (b"\tcontinued", "obs-fold"), (b"A b", "not token"),
    (b": b", "not token"), (b"A(: b", "not token"), (b"A: b\x00c", "not token"), (b"A: b\x7f", "not token"),
    (b"A: b\rc", "bare CR or LF"), (b"A: b\nc", "bare CR or LF"), (b"A: b\r", "bare CR or LF")])
def test_a_field_of_any_other_form_is_refused(field, match):
    refused(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + field + b"\r\n\r\n", match)


def test_a_repeated_field_is_one_list():
    head = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nVary: a\r\nvary: b")
    assert head.fields["vary"] == "a, b"


def test_header_fields_over_their_count_are_refused():
    fields = b"".join(b"F%d: v\r\n" % i for i in range(FIELD_COUNT_LIMIT - 1))
    assert len(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + fields[:-2]).fields) == FIELD_COUNT_LIMIT
    refused(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + fields + b"X: y\r\n\r\n", "header fields")


def test_a_head_over_its_size_is_refused_without_reading_on():
    head = b"HTTP/1.1 200 OK\r\nX: " + b"v" * HEAD_LIMIT
    with pytest.raises(ProtocolError, match="head longer than"):
        read_response(Pieces([head, b"\r\n" * 10_000]), bytearray())


# -- framing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, match", [
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked", "both"),
    (b"Content-Length: 5\r\nContent-Length: 6", "differing"), (b"Content-Length: 5, 6", "differing"),
    (b"Content-Length: -5", "not a number"), (b"Content-Length: 0x5", "not a number"),
    (b"Content-Length: ", "not a number"), (b"Content-Length: \xd9\xa5", "not a number"),
    (b"Transfer-Encoding: gzip, chunked", "only chunked"), (b"Transfer-Encoding: chunked, gzip", "only chunked"),
    (b"Content-Type: text/plain", "neither"),
    (b"Content-Length: %d" % (BODY_LIMIT + 1), "body of")])
def test_a_body_framed_twice_wrongly_or_not_at_all_is_refused(fields, match):
    refused(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n\r\nhello", match)


def test_repeated_equal_content_lengths_are_one():
    for fields in (b"Content-Length: 5\r\nContent-Length: 5", b"Content-Length: 5 , 5"):
        assert read(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n\r\nhello")[1] == b"hello"


def test_no_content_and_not_modified_have_no_body_and_interim_responses_are_skipped():
    head, body, extra = read(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1")
    assert head.status == 204 and body == b"" and extra == b"HTTP/1.1"
    head, body, _ = read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + SIZED)
    assert head.status == 200 and body == b"hello"
    refused(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "101")
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    assert read(interim * INTERIM_LIMIT + SIZED)[1] == b"hello"
    refused(interim * (INTERIM_LIMIT + 1) + SIZED, "interim")


@pytest.mark.parametrize("connection, version, close", [
    (b"", b"1.1", False), (b"Connection: close\r\n", b"1.1", True),
    (b"Connection: Keep-Alive, Close\r\n", b"1.1", True),
    (b"", b"1.0", True), (b"Connection: keep-alive\r\n", b"1.0", False)])
def test_the_connection_closes_when_the_response_says_so(connection, version, close):
    assert parse_head(b"HTTP/" + version + b" 200 OK\r\n" + connection + b"Content-Length: 0").close is close


def chunked(payload: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + payload


@pytest.mark.parametrize("payload, match", [
    (b"g\r\nhello\r\n0\r\n\r\n", "chunk-size line"), (b"-5\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
    (b" 5\r\nhello\r\n0\r\n\r\n", "chunk-size line"), (b"5;\r\nhello\r\n0\r\n\r\n", "chunk-size line"),
    (b"5;a=\"b\r\nhello\r\n0\r\n\r\n", "chunk-size line"), (b"5\nhello\r\n0\r\n\r\n", "bare CR or LF"),
    (b"5\r\nhelloXX0\r\n\r\n", "not followed by CRLF"), (b"3\r\nhello\r\n0\r\n\r\n", "not followed by CRLF"),
    (b"11111111111111111\r\n", "chunk-size line"), (b"%x\r\n" % (BODY_LIMIT + 1), "chunked body of more"),
    (b"0\r\nA : b\r\n\r\n", "trailer field"), (b"0\r\n folded\r\n\r\n", "obs-fold"),
    (b"0\r\nA: b\rc\r\n\r\n", "bare CR or LF")])
def test_chunked_framing_of_any_other_form_is_refused(payload, match):
    refused(chunked(payload), match)


def test_chunk_lines_and_trailers_are_bounded():
    line = b"5;" + b"a" * (CHUNK_LINE_LIMIT - 2)
    assert read(chunked(line + b"\r\nhello\r\n0\r\n\r\n"))[1] == b"hello"
    refused(chunked(line + b"a\r\nhello\r\n0\r\n\r\n"), "no end of a chunk-size line")
    many = b"".join(b"T%d: v\r\n" % i for i in range(FIELD_COUNT_LIMIT + 1))
    refused(chunked(b"0\r\n" + many + b"\r\n"), "trailer fields")
    refused(chunked(b"0\r\nT: " + b"v" * HEAD_LIMIT + b"\r\n\r\n"), "no end of a trailer line")


@pytest.mark.parametrize("raw", [SIZED, CHUNKED])
def test_a_response_cut_short_is_a_closed_connection(raw):
    for cut in range(len(raw)):
        with pytest.raises(ServerUnavailable, match="connection closed"):
            read(raw[:cut])


# -- fragmentation ----------------------------------------------------------------------------------

RESPONSES = [SIZED, CHUNKED, b"HTTP/1.1 100 Continue\r\n\r\n" + SIZED,
             chunked(b"A\r\n0123456789\r\n1;x\r\n!\r\n0;last\r\nT: v\r\nU:\r\n\r\n")]


def parsed(pieces: list[bytes]):
    """What was read, and the bytes past the response (read with it, or left unread)."""
    sock = Pieces(pieces)
    head, body, extra = read_response(sock, bytearray())
    return head.status, head.fields, bytes(body), head.close, extra + b"".join(sock.pieces)


@pytest.mark.parametrize("raw", RESPONSES)
def test_a_response_split_at_any_one_point_reads_the_same(raw):
    sent = raw + b"HTTP"
    whole = parsed([sent])
    assert whole[2] and whole[4] == b"HTTP"
    for cut in range(1, len(sent)):
        assert parsed([sent[:cut], sent[cut:]]) == whole, cut


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(RESPONSES), st.lists(st.integers(min_value=1, max_value=200), max_size=40))
def test_a_response_in_pieces_of_any_sizes_reads_the_same(raw, sizes):
    pieces, offset = [], 0
    for size in sizes:
        pieces.append(raw[offset:offset + size])
        offset += size
    pieces.append(raw[offset:])
    assert parsed(pieces) == parsed([raw])
