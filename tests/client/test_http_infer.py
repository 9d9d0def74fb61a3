"""The HTTP transport's handling of what a real Triton does not do on demand: chunked answers,
error statuses, a kept-alive connection closed by the server. A scripted server on 127.0.0.1
answers with fixed bytes and keeps what it received (the answers of a real server are checked in
test_triton.py against NVIDIA's client)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import orjson
import pytest

from hstu_replay.client.http_infer import HttpInfer
from hstu_replay.errors import ServerError, ServerUnavailable

LOGITS = np.arange(16, dtype=np.float32).reshape(2, 8)


def binary_answer(chunked: bool = False, close: bool = False) -> bytes:
    header = orjson.dumps({"model_name": "m", "outputs": [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": [2, 8], "parameters": {"binary_data_size": 64}}]})
    body = header + LOGITS.tobytes()
    head = f"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: {len(header)}\r\n"
    head += "Connection: close\r\n" if close else ""
    if chunked:
        pieces = [body[:10], body[10:50], body[50:]]
        payload = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + payload
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class HangUp(bytes):
    """A reply after which the server closes the connection, without saying so in its headers."""


class Scripted:
    """Accepts connections one at a time; answers each request with the next scripted reply
    (None: close the connection without answering; HangUp: answer, then close). Records each
    request's bytes."""

    def __init__(self, replies: list[bytes | None]):
        self.replies, self.requests, self.connections = list(replies), [], 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.replies:
            conn, _ = self.listener.accept()
            self.connections += 1
            with conn:
                while self.replies:
                    request = self._read(conn)
                    if request is None:
                        break
                    self.requests.append(request)
                    reply = self.replies.pop(0)
                    if reply is None:
                        break
                    conn.sendall(reply)
                    if isinstance(reply, HangUp):
                        break

    @staticmethod
    def _read(conn) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        size = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < size:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body


INPUTS = [("INPUT__0", (np.array([1, 2, 3], dtype=np.int64), np.array([4], dtype=np.int64))),
          ("INPUT__1", (np.array([9, 9], dtype=np.int64),))]


def client(server: Scripted) -> HttpInfer:
    return HttpInfer("127.0.0.1", server.port, "m", {"Authorization": "Bearer x"}, timeout_s=5)


def test_a_request_is_the_json_header_then_each_input_as_raw_bytes():
    server = Scripted([binary_answer()])
    outputs, seconds = client(server).infer(INPUTS, ["OUTPUT__0"])
    np.testing.assert_array_equal(outputs["OUTPUT__0"], LOGITS)
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v2/models/m/infer HTTP/1.1") and b"Authorization: Bearer x" in head
    size = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.startswith(b"Inference-Header")))
    header = orjson.loads(body[:size])
    assert header["inputs"] == [
        {"name": "INPUT__0", "shape": [4], "datatype": "INT64", "parameters": {"binary_data_size": 32}},
        {"name": "INPUT__1", "shape": [2], "datatype": "INT64", "parameters": {"binary_data_size": 16}}]
    assert header["outputs"] == [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]
    np.testing.assert_array_equal(np.frombuffer(body[size:], dtype="<i8"), [1, 2, 3, 4, 9, 9])
    assert seconds > 0


def test_a_chunked_answer_and_a_closing_server_are_read_whole():
    server = Scripted([binary_answer(chunked=True, close=True), binary_answer()])
    c = client(server)
    for _ in range(2):
        outputs, _ = c.infer(INPUTS, ["OUTPUT__0"])
        np.testing.assert_array_equal(outputs["OUTPUT__0"], LOGITS)
    assert server.connections == 2  # the first answer said Connection: close


def test_an_error_status_is_one_line_with_the_servers_message():
    error = b'{"error":"in ensemble: shape mismatch"}'
    unknown = b'{"error":"Request for unknown model: \'m\' is not found"}'
    server = Scripted([f"HTTP/1.1 400 Bad Request\r\nContent-Length: {len(e)}\r\n\r\n".encode() + e
                       for e in (error, unknown)])
    c = client(server)
    with pytest.raises(ServerError, match="HTTP 400: in ensemble: shape mismatch") as caught:
        c.infer(INPUTS, ["OUTPUT__0"])
    assert not isinstance(caught.value, ServerUnavailable)
    with pytest.raises(ServerUnavailable, match="unknown model"):  # a server back up, model not loaded yet
        c.infer(INPUTS, ["OUTPUT__0"])


def test_a_connection_dropped_mid_request_is_unavailable_and_the_next_request_reconnects():
    server = Scripted([None, binary_answer()])
    c = client(server)
    with pytest.raises(ServerUnavailable):
        c.infer(INPUTS, ["OUTPUT__0"])
    outputs, _ = c.infer(INPUTS, ["OUTPUT__0"])
    np.testing.assert_array_equal(outputs["OUTPUT__0"], LOGITS)
    assert server.connections == 2


def test_an_idle_connection_closed_by_the_server_is_replaced_before_sending(monkeypatch):
    import hstu_replay.client.http_infer as module

    monkeypatch.setattr(module, "_IDLE_CHECK_S", 0.0)
    server = Scripted([HangUp(binary_answer()), binary_answer()])
    c = client(server)
    c.infer(INPUTS, ["OUTPUT__0"])  # the server closes this connection after answering
    time.sleep(0.2)
    outputs, _ = c.infer(INPUTS, ["OUTPUT__0"])  # sent on a new connection, not into the closed one
    np.testing.assert_array_equal(outputs["OUTPUT__0"], LOGITS)
    assert len(server.requests) == 2 and server.connections == 2


@pytest.mark.parametrize("reply, text", [
    (b"\x00junk1234" + binary_answer(), "the status line is not HTTP/1.x"),  # once taken as a 200
    (binary_answer() + b"HTTP/1.1 200 OK\r\n", "bytes past the end of a response"),
    (binary_answer().replace(b"Content-Length:", b"Content-Length :"), "not token"),
    (binary_answer().replace(b"\r\n\r\n", b"\r\nContent-Length: 1\r\n\r\n", 1), "differing Content-Lengths")])
def test_a_response_that_is_not_http_1_1_is_a_protocol_error_and_the_connection_is_made_again(reply, text):
    from hstu_replay.errors import ProtocolError

    server = Scripted([reply, binary_answer()])
    c = client(server)
    with pytest.raises(ProtocolError, match=text):
        c.infer(INPUTS, ["OUTPUT__0"])
    outputs, _ = c.infer(INPUTS, ["OUTPUT__0"])
    np.testing.assert_array_equal(outputs["OUTPUT__0"], LOGITS)
    assert server.connections == 2  # not reused after the framing error
