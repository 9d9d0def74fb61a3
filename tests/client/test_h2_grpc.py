"""The gRPC-over-HTTP/2 transport against a server end written here with the `h2` library (a second,
independent HTTP/2 implementation), for what a real Triton cannot be made to do on demand: small
windows that stall a large request, pings in the middle of a call, reset streams, missing or
odd trailers, statuses of every kind, GOAWAY, a connection closed between calls, no answer at
all. The answers of a real server are checked in test_triton.py against NVIDIA's client."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import numpy as np
import pytest
from tritonclient.grpc.service_pb2 import ModelInferRequest, ModelInferResponse

from hstu_replay.client.grpc_message import METHOD
from hstu_replay.client.h2_grpc import H2Grpc, grpc_timeout, request_block
from hstu_replay.errors import AccessDenied, ServerError, ServerUnavailable

LOGITS = np.arange(16, dtype=np.float32).reshape(2, 8)


def answer_message(logits: np.ndarray = LOGITS) -> bytes:
    response = ModelInferResponse(model_name="m")
    out = response.outputs.add(name="OUTPUT__0", datatype="FP32")
    out.shape.extend(logits.shape)
    response.raw_output_contents.append(logits.tobytes())
    raw = response.SerializeToString()
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


@dataclass
class Request:
    stream: int
    headers: dict[bytes, bytes]
    body: bytearray = field(default_factory=bytearray)

    @property
    def message(self) -> ModelInferRequest:
        assert self.body[0] == 0 and int.from_bytes(self.body[1:5], "big") == len(self.body) - 5
        return ModelInferRequest.FromString(bytes(self.body[5:]))


#: answers through the connection; returns "close" to hang up after, or raw bytes to send after
Handler = Callable[["H2Server", h2.connection.H2Connection, Request], "str | bytes | None"]


def ok(server, conn, request) -> None:
    conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    conn.send_data(request.stream, answer_message())
    conn.send_headers(request.stream, [(b"grpc-status", b"0")], end_stream=True)


class H2Server:
    """HTTP/2 on 127.0.0.1 through `h2`, a thread per connection; each finished request goes to
    `handler` (which answers through the connection, or returns "close" to hang up). `window`:
    the server's initial windows and the most it grants at a time."""

    def __init__(self, handler: Handler, window: int = 65_535, max_frame: int = 16_384):
        self.handler, self.window, self.max_frame = handler, window, max_frame
        self.requests: list[Request] = []
        self.connections = 0
        self.events: list = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopped = False
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def client(self, timeout_s: float = 5.0, headers: dict | None = None) -> H2Grpc:
        return H2Grpc("127.0.0.1", self.port, "m", headers or {}, timeout_s)

    def stop(self) -> None:
        """Stop listening and hang up every open connection at once (a thread blocked in `recv`
        would otherwise answer one more request)."""
        self.stopped = True
        self.listener.close()
        for sock in self.open:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self.stopped:
            try:
                sock, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self.open.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.window,
                              h2.settings.SettingCodes.MAX_FRAME_SIZE: self.max_frame})
        if self.window > 65_535:  # the connection's window too, as Triton does
            conn.increment_flow_control_window(self.window - 65_535)
        sock.sendall(conn.data_to_send())
        sock.settimeout(10)
        open_requests: dict[int, Request] = {}
        with sock, contextlib.suppress(OSError):  # a connection hung up by `stop` ends here
            while not self.stopped:
                data = sock.recv(65536)
                if not data:
                    return
                for event in conn.receive_data(data):
                    self.events.append(event)
                    if isinstance(event, h2.events.RequestReceived):
                        open_requests[event.stream_id] = Request(event.stream_id, dict(event.headers))
                    elif isinstance(event, h2.events.DataReceived):
                        open_requests[event.stream_id].body += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        request = open_requests.pop(event.stream_id)
                        self.requests.append(request)
                        done = self.handler(self, conn, request)
                        sock.sendall(conn.data_to_send())
                        if isinstance(done, bytes):  # frames h2 would not write
                            sock.sendall(done)
                        if done == "close":
                            return
                sock.sendall(conn.data_to_send())


@pytest.fixture
def serve():
    servers = []

    def start(handler: Handler = ok, **kwargs) -> H2Server:
        servers.append(H2Server(handler, **kwargs))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


INPUTS = [("INPUT__0", (np.arange(5, dtype=np.int64), np.arange(7, dtype=np.int64))),
          ("INPUT__1", (np.array([3, 4], dtype=np.int64),))]


def test_a_call_sends_the_grpc_request_and_reads_the_answer(serve):
    server = serve()
    client = server.client(timeout_s=12.5, headers={"X-Token": "secret", "triton-grpc-protocol-a": "b"})
    out, seconds = client.infer(INPUTS, ("OUTPUT__0",))
    np.testing.assert_array_equal(out["OUTPUT__0"], LOGITS)
    assert 0 < seconds < 5
    (request,) = server.requests
    h = request.headers
    assert (h[b":method"], h[b":scheme"], h[b":path"]) == (b"POST", b"http", METHOD.encode())
    assert h[b":authority"] == f"127.0.0.1:{server.port}".encode()
    assert (h[b"content-type"], h[b"te"], h[b"grpc-timeout"]) == (b"application/grpc", b"trailers", b"12500m")
    assert (h[b"x-token"], h[b"triton-grpc-protocol-a"]) == (b"secret", b"b")  # names in lower case
    message = request.message
    assert message.model_name == "m" and [o.name for o in message.outputs] == ["OUTPUT__0"]
    sent = [np.frombuffer(raw, "<i8") for raw in message.raw_input_contents]
    np.testing.assert_array_equal(sent[0], np.r_[np.arange(5), np.arange(7)])
    np.testing.assert_array_equal(sent[1], [3, 4])


def test_calls_share_one_connection_on_new_streams(serve):
    server = serve()
    client = server.client()
    for _ in range(5):
        client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 1
    assert [r.stream for r in server.requests] == [1, 3, 5, 7, 9]


@pytest.mark.parametrize("window, max_frame", [(65_535, 16_384), (1_000, 16_384), (4_194_304, 4_194_304)])
def test_a_large_request_follows_the_servers_windows_and_frame_size(serve, window, max_frame):
    """0.5 MB through windows of 1,000 bytes and 64 KiB (the default) stalls until the server grants
    more; with Triton's 4 MiB it goes in one frame. Every byte arrives, in order."""
    server = serve(window=window, max_frame=max_frame)
    client = server.client()
    big = np.random.default_rng(0).integers(-2**62, 2**62, 67_184)
    for _ in range(2):
        client.infer([("INPUT__0", (big[:1000], big[1000:]))], ("OUTPUT__0",))
    for request in server.requests:
        np.testing.assert_array_equal(np.frombuffer(request.message.raw_input_contents[0], "<i8"), big)
    frames = [e for e in server.events if isinstance(e, h2.events.DataReceived) and e.stream_id == 3]
    assert max(len(e.data) for e in frames) <= min(window, max_frame)


def test_with_windows_wide_enough_a_request_goes_out_in_one_write(serve, monkeypatch):
    """Frame heads, header block and the whole message, from the numpy pieces as they are."""
    from hstu_replay.client import h2_grpc

    writes, send_all = [], h2_grpc.send_all
    monkeypatch.setattr(h2_grpc, "send_all",
                        lambda sock, buffers: writes.append(list(buffers)) or send_all(sock, buffers))
    server = serve(window=4_194_304, max_frame=4_194_304)
    client = server.client()
    big = np.arange(67_184, dtype=np.int64)
    client.infer([("INPUT__0", (big,))], ("OUTPUT__0",))  # the first also waits for the server's SETTINGS
    writes.clear()
    client.infer([("INPUT__0", (big,))], ("OUTPUT__0",))
    (write,) = writes
    assert any(b is big for b in write)  # not copied
    assert sum(memoryview(b).nbytes for b in write) > big.nbytes


def test_our_windows_are_raised_at_the_start_so_a_large_answer_is_not_stalled(serve):
    big = np.zeros((40_000, 8), dtype=np.float32)  # 1.28 MB, past the default 64 KiB windows

    def large(server, conn, request):
        message = answer_message(big)
        assert conn.local_flow_control_window(request.stream) >= len(message)
        conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        for i in range(0, len(message), 16_384):
            conn.send_data(request.stream, message[i:i + 16_384])
        conn.send_headers(request.stream, [(b"grpc-status", b"0")], end_stream=True)

    client = serve(large).client()
    out, _ = client.infer(INPUTS, ("OUTPUT__0",))
    assert out["OUTPUT__0"].shape == (40_000, 8)


def test_pings_in_the_middle_of_a_call_are_answered(serve):
    def ping_first(server, conn, request):
        conn.ping(b"12345678")
        ok(server, conn, request)

    server = serve(ping_first)
    client = server.client()
    client.infer(INPUTS, ("OUTPUT__0",))
    client.infer(INPUTS, ("OUTPUT__0",))  # the acknowledgement goes out with the next read or write
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in server.events)


def status_answer(code: int, message: bytes = b"", trailers_only: bool = False, http: bytes = b"200"):
    def handler(server, conn, request):
        status = [(b"grpc-status", str(code).encode()), (b"grpc-message", message)]
        head = [(b":status", http), (b"content-type", b"application/grpc")]
        if trailers_only:
            conn.send_headers(request.stream, head + status, end_stream=True)
        else:
            conn.send_headers(request.stream, head)
            conn.send_headers(request.stream, status, end_stream=True)
    return handler


@pytest.mark.parametrize("code, message, kind, text", [
    (14, b"", ServerUnavailable, "UNAVAILABLE: "),
    (5, b"Request for unknown model", ServerUnavailable, "NOT_FOUND: Request for unknown model"),
    (16, b"no", AccessDenied, "UNAUTHENTICATED: no"),
    (7, b"no", AccessDenied, "PERMISSION_DENIED: no"),
    (14, b"This protocol is restricted, expecting header 'x'", AccessDenied,
     "UNAVAILABLE: This protocol is restricted"),
    (3, b"unexpected inference input %27INPUT__9%27%20100%25", ServerError,
     "INVALID_ARGUMENT: unexpected inference input 'INPUT__9' 100%"),
    (13, b"", ServerError, "INTERNAL: "),
    (99, b"what", ServerError, "UNKNOWN: what"),
])
@pytest.mark.parametrize("trailers_only", [False, True])
def test_statuses_map_to_errors_as_grpcios_codes_do(serve, code, message, kind, text, trailers_only):
    server = serve(status_answer(code, message, trailers_only))
    client = server.client()
    with pytest.raises(ServerError) as raised:
        client.infer(INPUTS, ("OUTPUT__0",))
    assert type(raised.value) is kind and str(raised.value).startswith(text)
    out, _ = client.__class__("127.0.0.1", serve().port, "m", {}, 5).infer(INPUTS, ("OUTPUT__0",))
    assert out["OUTPUT__0"].shape == (2, 8)


def test_after_an_error_status_the_connection_carries_the_next_call(serve):
    answers = iter([status_answer(3, b"bad"), ok])
    server = serve(lambda s, c, r: next(answers)(s, c, r))
    client = server.client()
    with pytest.raises(ServerError, match="INVALID_ARGUMENT: bad"):
        client.infer(INPUTS, ("OUTPUT__0",))
    client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 1


@pytest.mark.parametrize("http, kind", [(b"503", ServerUnavailable), (b"401", AccessDenied), (b"403", AccessDenied),
                                        (b"404", ServerError), (b"500", ServerError)])
def test_an_http_status_other_than_200_maps_as_grpc_says(serve, http, kind):
    client = serve(status_answer(0, trailers_only=True, http=http)).client()
    with pytest.raises(kind, match=f"HTTP status {http.decode()}"):
        client.infer(INPUTS, ("OUTPUT__0",))


def test_trailers_without_a_status_are_a_server_error(serve):
    def no_status(server, conn, request):
        conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        conn.send_data(request.stream, answer_message())
        conn.send_headers(request.stream, [(b"grpc-message", b"forgot")], end_stream=True)

    with pytest.raises(ServerError, match="without a grpc-status"):
        serve(no_status).client().infer(INPUTS, ("OUTPUT__0",))


@pytest.mark.parametrize("body, text", [
    (b"\x00\x00\x00", "carried 3 bytes"),
    (b"\x01\x00\x00\x00\x01x", "compressed"),
    (b"\x00\x00\x00\x00\x09abc", "says 9 bytes, 3 came"),
    (b"\x00\x00\x00\x00\x03abc", "malformed inference response"),
])
def test_a_malformed_message_is_a_server_error(serve, body, text):
    def bad(server, conn, request):
        conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        conn.send_data(request.stream, body)
        conn.send_headers(request.stream, [(b"grpc-status", b"0")], end_stream=True)

    with pytest.raises(ServerError, match=text):
        serve(bad).client().infer(INPUTS, ("OUTPUT__0",))


def test_a_frame_that_cannot_be_read_fails_the_call_and_the_next_one_reconnects(serve):
    from hstu_replay.client.h2_grpc import DATA, PADDED, frame_head

    def padded_past_its_end(server, conn, request):
        conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        return frame_head(4, DATA, PADDED, request.stream) + b"\x09abc"  # 9 bytes of padding in 3

    answers = iter([padded_past_its_end, ok])
    server = serve(lambda s, c, r: next(answers)(s, c, r))
    client = server.client()
    with pytest.raises(ServerError, match="padding is longer than the frame"):
        client.infer(INPUTS, ("OUTPUT__0",))
    client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 2


@pytest.mark.parametrize("kind", ["DATA", "HEADERS", "PING"])
def test_a_frame_over_the_frame_size_our_settings_allow_is_refused_at_its_head(serve, kind):
    """We announce no SETTINGS_MAX_FRAME_SIZE, so 16,384 bytes is the most a frame may carry (RFC
    9113 4.2): one byte more is refused from its 9-byte head, without waiting for the payload
    (none follows here), and the next call is on a new connection."""
    from hstu_replay.client import h2_grpc
    from hstu_replay.errors import ProtocolError

    def oversize(server, conn, request):
        return h2_grpc.frame_head(16_385, getattr(h2_grpc, kind), 0, request.stream if kind != "PING" else 0)

    answers = iter([oversize, ok])
    server = serve(lambda s, c, r: next(answers)(s, c, r))
    client = server.client(timeout_s=30)
    start = time.monotonic()
    with pytest.raises(ProtocolError, match="FRAME_SIZE_ERROR: a frame of 16385 bytes"):
        client.infer(INPUTS, ("OUTPUT__0",))
    assert time.monotonic() - start < 5
    np.testing.assert_array_equal(client.infer(INPUTS, ("OUTPUT__0",))[0]["OUTPUT__0"], LOGITS)
    assert server.connections == 2


def test_a_frame_of_exactly_the_default_frame_size_is_read(serve):
    """The answer's message in one padded DATA frame of 16,384 bytes (written by hand: `h2` splits
    what it sends at our frame size), its trailers after it."""
    import hpack

    from hstu_replay.client import h2_grpc

    logits = np.arange(508 * 8, dtype=np.float32).reshape(508, 8)
    message = answer_message(logits)
    pad = h2_grpc.DEFAULT_FRAME - 1 - len(message)
    assert 0 <= pad <= 255

    def one_full_frame(server, conn, request):
        conn.send_headers(request.stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        trailers = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(b"grpc-status", b"0")])
        return (h2_grpc.frame_head(h2_grpc.DEFAULT_FRAME, h2_grpc.DATA, h2_grpc.PADDED, request.stream)
                + bytes([pad]) + message + bytes(pad)
                + h2_grpc.frame_head(len(trailers), h2_grpc.HEADERS, h2_grpc.END_STREAM | h2_grpc.END_HEADERS,
                                     request.stream) + trailers)

    outputs, _ = serve(one_full_frame).client().infer(INPUTS, ("OUTPUT__0",))
    np.testing.assert_array_equal(outputs["OUTPUT__0"], logits)


@pytest.mark.parametrize("code, text", [(h2.errors.ErrorCodes.CANCEL, "CANCELLED"),
                                        (h2.errors.ErrorCodes.INTERNAL_ERROR, "INTERNAL"),
                                        (h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, "RESOURCE_EXHAUSTED")])
def test_a_reset_stream_is_a_server_error_and_the_connection_goes_on(serve, code, text):
    answers = iter([lambda s, c, r: c.reset_stream(r.stream, code), ok])
    server = serve(lambda s, c, r: next(answers)(s, c, r))
    client = server.client()
    with pytest.raises(ServerError, match=f"{text}: stream reset"):
        client.infer(INPUTS, ("OUTPUT__0",))
    client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 1


def test_a_refused_stream_is_sent_again_once_on_a_new_connection(serve):
    answers = iter([lambda s, c, r: c.reset_stream(r.stream, h2.errors.ErrorCodes.REFUSED_STREAM), ok])
    server = serve(lambda s, c, r: next(answers)(s, c, r))
    out, _ = server.client().infer(INPUTS, ("OUTPUT__0",))
    assert out["OUTPUT__0"].shape == (2, 8) and server.connections == 2 and len(server.requests) == 2


def test_refused_twice_is_unavailable(serve):
    server = serve(lambda s, c, r: c.reset_stream(r.stream, h2.errors.ErrorCodes.REFUSED_STREAM))
    with pytest.raises(ServerUnavailable, match="REFUSED_STREAM"):
        server.client().infer(INPUTS, ("OUTPUT__0",))
    assert len(server.requests) == 2


def test_goaway_below_the_stream_is_sent_again_on_a_new_connection(serve):
    def going_away(server, conn, request):
        if server.connections == 1:
            conn.close_connection(last_stream_id=0)  # took none of the streams
            return "close"
        ok(server, conn, request)

    server = serve(going_away)
    out, _ = server.client().infer(INPUTS, ("OUTPUT__0",))
    assert out["OUTPUT__0"].shape == (2, 8) and server.connections == 2


def test_goaway_after_the_answer_moves_the_next_call_to_a_new_connection(serve):
    def answer_then_leave(server, conn, request):
        ok(server, conn, request)
        conn.close_connection(last_stream_id=request.stream)
        return "close"

    server = serve(answer_then_leave)
    client = server.client()
    for _ in range(3):
        client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 3


def test_a_connection_closed_without_an_answer_is_unavailable_and_the_next_call_reconnects(serve):
    answers = iter(["close", None])
    server = serve(lambda s, c, r: next(answers) or ok(s, c, r))
    client = server.client()
    with pytest.raises(ServerUnavailable, match="UNAVAILABLE: connection lost"):
        client.infer(INPUTS, ("OUTPUT__0",))
    client.infer(INPUTS, ("OUTPUT__0",))
    assert server.connections == 2


def test_a_server_that_went_away_while_idle_is_reconnected_to(serve, monkeypatch):
    server = serve()
    client = server.client()
    client.infer(INPUTS, ("OUTPUT__0",))
    server.stop()
    time.sleep(0.1)
    with pytest.raises(ServerUnavailable):
        client.infer(INPUTS, ("OUTPUT__0",))
    again = serve()
    client.address = ("127.0.0.1", again.port)
    client.infer(INPUTS, ("OUTPUT__0",))
    assert again.connections == 1


def test_no_answer_before_the_deadline_is_deadline_exceeded(serve):
    server = serve(lambda s, c, r: None)  # takes the request, never answers
    client = server.client(timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(ServerError, match="DEADLINE_EXCEEDED"):
        client.infer(INPUTS, ("OUTPUT__0",))
    assert 0.25 < time.monotonic() - start < 3


def test_nothing_listening_is_unavailable():
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]  # bound, closed at once: nothing listens
    with pytest.raises(ServerUnavailable, match="cannot connect"):
        H2Grpc("127.0.0.1", port, "m", {}, 2).infer(INPUTS, ("OUTPUT__0",))


@pytest.mark.parametrize("seconds, value", [(30, "30000m"), (0.0004, "1m"), (99_999.999, "99999999m"),
                                            (100_000, "100000S"), (10**9, "99999999S")])
def test_grpc_timeout_has_at_most_eight_digits(seconds, value):
    assert grpc_timeout(seconds) == value


def test_the_request_header_block_leaves_the_dynamic_table_empty():
    import hpack

    block = request_block("::1", 8001, True, 30, {"X-A": "1"})
    decoder = hpack.Decoder()
    fields = dict(decoder.decode(block, raw=True))
    assert fields[b":authority"] == b"[::1]:8001" and fields[b":scheme"] == b"https" and fields[b"x-a"] == b"1"
    assert len(decoder.header_table.dynamic_entries) == 0  # so the same bytes fit every connection
