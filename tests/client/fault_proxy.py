"""A TCP proxy on 127.0.0.1 that passes bytes through to a real server and, when armed, spoils
one answer: the first bytes the server sends after the client sent a request (HTTP/1.1: any bytes;
HTTP/2: a HEADERS frame), which for a client with one request in flight are the answer's start.

Faults: the connection reset (RST), the answer held back for `stall_s` then the connection
closed, the answer cut in half then the connection closed, nine junk bytes before it, 3,000
random bytes in the middle of it, and, for HTTP/2, a frame head announcing one byte more than
the 16,384 a client allows until it says otherwise, put at the first frame boundary of the
answer. Faults are armed for the next answers (`arm`) or for every n-th answer (`arm_every`),
so a run sees answers spoiled among clean ones; `injected` lists what was done.
"""

from __future__ import annotations

import enum
import random
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_HEADERS = 0x1
H2_DEFAULT_FRAME = 16_384  # RFC 9113 4.2: SETTINGS_MAX_FRAME_SIZE until a client announces one
JUNK_BEFORE = 9  # bytes of junk before an answer
JUNK_INSIDE = 3_000  # random bytes in the middle of an answer


class Fault(enum.Enum):
    RESET = "reset"
    STALL = "stall"
    TRUNCATE = "truncate"
    JUNK_BEFORE = "junk-before"
    JUNK_INSIDE = "junk-inside"
    H2_OVERSIZE = "h2-oversize"


class Frames:
    """The frames of one direction of an HTTP/2 connection, followed across chunks (`skip`: bytes
    before the first frame, the client's 24-byte preface)."""

    def __init__(self, skip: int = 0):
        self.head = b""  # a frame head read in part
        self.left = skip  # bytes of the current frame's payload (or of the preface) not seen yet

    def scan(self, chunk: bytes) -> tuple[list[int], list[int]]:
        """Where in `chunk` frames start, and the types of the frames whose heads end in it; the
        state moves past the chunk."""
        starts, kinds, pos = [], [], 0
        while pos < len(chunk):
            if self.left:
                step = min(self.left, len(chunk) - pos)
                self.left -= step
                pos += step
                continue
            if not self.head:
                starts.append(pos)
            take = chunk[pos:pos + 9 - len(self.head)]
            self.head += take
            pos += len(take)
            if len(self.head) == 9:
                kinds.append(self.head[3])
                self.left, self.head = int.from_bytes(self.head[:3], "big"), b""
        return starts, kinds


@dataclass
class Pair:
    """One client connection and its connection to the server."""

    client: socket.socket
    server: socket.socket
    asked: bool = False  # the client sent a request since the server last sent anything
    up: Frames = field(default_factory=lambda: Frames(len(H2_PREFACE)))  # HTTP/2: the client's frames
    down: Frames = field(default_factory=Frames)  # HTTP/2: the server's


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], h2: bool, stall_s: float = 6.0, seed: int = 0):
        self.upstream, self.h2, self.stall_s = upstream, h2, stall_s
        self.random = random.Random(seed)
        self.injected: list[Fault] = []
        self.answers = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._armed: list[Fault] = []  # faults for the next answers, in order
        self._every: tuple[int, list[Fault]] | None = None
        self._pairs: list[Pair] = []
        self._closed = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, *faults: Fault) -> None:
        """Spoil the next answers, one fault each, in order."""
        with self._lock:
            self._armed += faults

    def arm_every(self, n: int, faults: list[Fault]) -> None:
        """Spoil every `n`-th answer from now with the next of `faults`, each once; then pass through."""
        with self._lock:
            self._every, self.answers = (n, list(faults)), 0

    def clean(self) -> None:
        """Pass everything through from now."""
        with self._lock:
            self._armed, self._every = [], None

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for pair in self._pairs:
            _hang_up(pair)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = Pair(client, server)
            self.connections += 1
            self._pairs.append(pair)
            threading.Thread(target=self._relay, args=(pair,), daemon=True).start()

    def _relay(self, pair: Pair) -> None:
        """Both directions in one thread, so a fault's close is the socket's last use (a close
        while another thread waits in `recv` would not reset the connection)."""
        try:
            while True:
                readable, _, _ = select.select([pair.client, pair.server], [], [])
                if pair.client in readable:
                    data = pair.client.recv(65536)
                    if not data:
                        break
                    # a request: HTTP/1.1 sends nothing else; over HTTP/2, a stream's HEADERS
                    pair.asked |= not self.h2 or H2_HEADERS in pair.up.scan(data)[1]
                    pair.server.sendall(data)
                if pair.server in readable:
                    data = pair.server.recv(65536)
                    if not data:
                        break
                    boundary = pair.down.scan(data)[0][:1] if self.h2 else []
                    fault = self._fault() if pair.asked else None
                    pair.asked = False
                    if fault is None:
                        pair.client.sendall(data)
                    elif not self._spoil(pair, fault, data, boundary):
                        break
        except (OSError, ValueError):  # ValueError: a socket closed by `close`
            pass
        _hang_up(pair)

    def _fault(self) -> Fault | None:
        with self._lock:
            self.answers += 1
            if self._armed:
                fault = self._armed.pop(0)
            elif self._every is not None and self.answers % self._every[0] == 0:
                n, faults = self._every
                fault = faults.pop(0)
                if not faults:
                    self._every = None
            else:
                return None
            self.injected.append(fault)
            return fault

    def _spoil(self, pair: Pair, fault: Fault, data: bytes, boundary: list[int]) -> bool:
        """Send `data` spoiled by `fault`; False when the connection is to end here."""
        if fault is Fault.RESET:  # closed at once with a zero linger: RST, not FIN
            pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            pair.client.close()
            return False
        if fault is Fault.STALL:
            time.sleep(self.stall_s)
            return False
        if fault is Fault.TRUNCATE:
            pair.client.sendall(data[:len(data) // 2])
            return False
        if fault is Fault.JUNK_BEFORE:
            pair.client.sendall(self.random.randbytes(JUNK_BEFORE) + data)
        elif fault is Fault.JUNK_INSIDE:
            middle = len(data) // 2
            pair.client.sendall(data[:middle] + self.random.randbytes(JUNK_INSIDE) + data[middle:])
        elif fault is Fault.H2_OVERSIZE:
            at = boundary[0] if boundary else len(data)  # no frame starts in it: after it
            head = (H2_DEFAULT_FRAME + 1).to_bytes(3, "big") + bytes([0, 0]) + (1).to_bytes(4, "big")  # DATA, stream 1
            pair.client.sendall(data[:at] + head + data[at:])
        return True


def _hang_up(pair: Pair) -> None:
    for sock in (pair.client, pair.server):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass
