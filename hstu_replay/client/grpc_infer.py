"""Inference over gRPC with the request message encoded straight from the request's buffers.

KServe's `ModelInferRequest` is a few short fields (model name, each input's name, datatype and
shape, the outputs wanted) followed by `raw_input_contents`, one bytes field per input. The
message is written here in protobuf's wire format: the short fields by hand, then each input's
numpy pieces, all joined once into the bytes grpcio sends. Building it through the generated
protobuf classes copies every input twice more (numpy -> bytes -> message -> serialized
bytes); BENCHMARKS.md ("Load generator cost") has the measured difference. The response is
decoded with tritonclient's generated `ModelInferResponse`; the test suite checks the encoding
against the generated `ModelInferRequest`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import numpy as np

from hstu_replay.client.http_infer import DTYPES
from hstu_replay.errors import AccessDenied, ServerError, ServerUnavailable

METHOD = "/inference.GRPCInferenceService/ModelInfer"
#: gRPC status codes that mean the server was not there to take the request (or has not loaded
#: the model again yet after a restart).
UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND)
#: Turned away for the credentials: by an authenticating proxy, or by Triton's restricted protocols,
#: which answer UNAVAILABLE with this message.
DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
RESTRICTED = "This protocol is restricted"
_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def tensor_spec(name: str, count: int) -> bytes:
    """`inputs` entry: InferInputTensor{name, datatype INT64, shape [count]} (shape packed)."""
    return field(5, field(1, name.encode()) + field(2, b"INT64") + field(3, varint(count)))


def encode_request(model: str, inputs: Sequence[tuple[str, tuple[np.ndarray, ...]]],
                   outputs: Sequence[str]) -> bytes:
    """The serialized ModelInferRequest of int64 `inputs` (name, contiguous pieces)."""
    parts: list = [field(1, model.encode())]
    parts += [tensor_spec(name, sum(len(p) for p in pieces)) for name, pieces in inputs]
    parts += [field(6, field(1, name.encode())) for name in outputs]
    for _, pieces in inputs:
        parts.append(varint(7 << 3 | 2) + varint(sum(p.nbytes for p in pieces)))
        parts += pieces
    return b"".join(parts)


def same_buffers(a: Sequence[tuple[str, tuple[np.ndarray, ...]]], b: Sequence[tuple[str, tuple[np.ndarray, ...]]]) -> bool:
    """Whether two requests' inputs are the very same arrays (a request sent again, as at a hit
    ratio of 1.0): then its message is too. Identity, not equality: holding `b` keeps its arrays
    alive, so no other array can take their place; the planner never writes into an array it has sent."""
    return len(a) == len(b) and all(
        na == nb and len(pa) == len(pb) and all(x is y for x, y in zip(pa, pb)) for (na, pa), (nb, pb) in zip(a, b))


class GrpcInfer:
    def __init__(self, url: str, model: str, headers: dict[str, str], timeout_s: float,
                 credentials: grpc.ChannelCredentials | None = None):
        self.model, self.timeout_s = model, timeout_s
        self._channel = (grpc.secure_channel(url, credentials, options=_CHANNEL_OPTIONS) if credentials is not None
                         else grpc.insecure_channel(url, options=_CHANNEL_OPTIONS))
        self._call = self._channel.unary_unary(METHOD)  # bytes in, bytes out
        self._metadata = tuple((k.lower(), v) for k, v in headers.items()) or None
        from tritonclient.grpc.service_pb2 import ModelInferResponse

        self._response = ModelInferResponse
        self._last: tuple = ((), (), b"")  # the last inputs and outputs sent, and their message

    def infer(self, inputs: Sequence[tuple[str, tuple[np.ndarray, ...]]],
              outputs: Sequence[str]) -> tuple[dict[str, np.ndarray], float]:
        """Send int64 `inputs` (name, contiguous pieces); returns the named outputs as arrays and
        the seconds the call took, from the encoded message handed over to the answer's bytes."""
        last_inputs, last_outputs, message = self._last
        if not (same_buffers(inputs, last_inputs) and tuple(outputs) == last_outputs):
            message = encode_request(self.model, inputs, outputs)
            self._last = (inputs, tuple(outputs), message)
        start = time.monotonic()
        try:
            raw = self._call(message, timeout=self.timeout_s, metadata=self._metadata)
            seconds = time.monotonic() - start
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = str(exc.details() if callable(getattr(exc, "details", None)) else exc)
            text = f"{code.name if code else 'gRPC error'}: {details}"
            kind = (AccessDenied if code in DENIED or details.startswith(RESTRICTED)
                    else ServerUnavailable if code in UNAVAILABLE else ServerError)
            raise kind(text) from None
        try:
            response = self._response.FromString(raw)
            out = {}
            for spec, data in zip(response.outputs, response.raw_output_contents):
                out[spec.name] = np.frombuffer(data, dtype=DTYPES[spec.datatype]).reshape(tuple(spec.shape))
            return out, seconds
        except (KeyError, ValueError) as exc:
            raise ServerError(f"malformed inference response: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._channel.close()
