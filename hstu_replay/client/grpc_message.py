"""KServe's gRPC inference messages, written and read without the generated classes' copies, and
gRPC status codes turned into the client's errors: what both gRPC transports share.

`ModelInferRequest` is a few short fields (model name, each input's name, datatype and shape,
the outputs wanted) followed by `raw_input_contents`, one bytes field per input. The message is
written here in protobuf's wire format: the short fields by hand, then each input's numpy pieces,
all joined once. Building it through the generated protobuf classes copies every input twice more
(numpy -> bytes -> message -> serialized bytes); BENCHMARKS.md ("Load generator cost") has the
measured difference. The response is decoded with tritonclient's generated `ModelInferResponse`;
the test suite checks the encoding against the generated `ModelInferRequest`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hstu_replay.client.http_infer import DTYPES
from hstu_replay.errors import AccessDenied, ServerError, ServerUnavailable

METHOD = "/inference.GRPCInferenceService/ModelInfer"
#: gRPC status codes by number (grpc/doc/statuscodes.md)
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")
#: Status codes that mean the server was not there to take the request (or has not loaded the
#: model again yet after a restart).
UNAVAILABLE = ("UNAVAILABLE", "NOT_FOUND")
#: Turned away for the credentials: by an authenticating proxy, or by Triton's restricted protocols,
#: which answer UNAVAILABLE with this message.
DENIED = ("UNAUTHENTICATED", "PERMISSION_DENIED")
RESTRICTED = "This protocol is restricted"

Inputs = Sequence[tuple[str, tuple[np.ndarray, ...]]]
_SMALL = [bytes((n,)) for n in range(0x80)]


@dataclass(frozen=True)
class Message:
    """A serialized ModelInferRequest as buffers to send in turn, and its length in bytes."""

    parts: list  # short fields as bytes, the inputs' numpy pieces as they are
    size: int


def varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


_RAW_CONTENTS = varint(7 << 3 | 2)  # raw_input_contents, length-delimited


def tensor_spec(name: str, count: int) -> bytes:
    """`inputs` entry: InferInputTensor{name, datatype INT64, shape [count]} (shape packed)."""
    return field(5, field(1, name.encode()) + field(2, b"INT64") + field(3, varint(count)))


def encode_request(model: str, inputs: Inputs, outputs: Sequence[str]) -> bytes:
    """The serialized ModelInferRequest of int64 `inputs` (name, contiguous pieces)."""
    return b"".join(encode_parts(model, inputs, outputs).parts)


def encode_parts(model: str, inputs: Inputs, outputs: Sequence[str]) -> Message:
    """The serialized ModelInferRequest of int64 `inputs` as buffers, nothing joined."""
    head: list = [field(1, model.encode())]
    contents: list = []
    size = 0
    for name, pieces in inputs:
        nbytes = sum([p.nbytes for p in pieces])
        head.append(tensor_spec(name, nbytes // 8))
        prefix = _RAW_CONTENTS + varint(nbytes)
        contents.append(prefix)
        contents += pieces
        size += len(prefix) + nbytes
    head += [field(6, field(1, name.encode())) for name in outputs]
    first = b"".join(head)
    return Message([first, *contents], len(first) + size)


def same_buffers(a: Inputs, b: Inputs) -> bool:
    """Whether two requests' inputs are the very same arrays (a request sent again, as at a hit
    ratio of 1.0): then its message is too. Identity, not equality: holding `b` keeps its arrays
    alive, so no other array can take their place; the planner never writes into an array it has sent."""
    return len(a) == len(b) and all(
        na == nb and len(pa) == len(pb) and all(x is y for x, y in zip(pa, pb)) for (na, pa), (nb, pb) in zip(a, b))


class RequestEncoder:
    """Encodes requests of one model, keeping the last message while the same request is sent
    again: as one bytes object (`encode_request`), or as a `Message` of buffers (`parts=True`)."""

    def __init__(self, model: str, parts: bool = False):
        self.model = model
        self._encode = encode_parts if parts else encode_request
        self._last: tuple = ((), (), b"")  # the last inputs and outputs encoded, and their message

    def encode(self, inputs: Inputs, outputs: Sequence[str]):
        last_inputs, last_outputs, message = self._last
        if not (same_buffers(inputs, last_inputs) and tuple(outputs) == last_outputs):
            message = self._encode(self.model, inputs, outputs)
            self._last = (inputs, tuple(outputs), message)
        return message


def decode_response(raw) -> dict[str, np.ndarray]:
    """The outputs of a serialized ModelInferResponse, as arrays by name."""
    from tritonclient.grpc.service_pb2 import ModelInferResponse

    try:
        response = ModelInferResponse.FromString(raw)
        out = {}
        for spec, data in zip(response.outputs, response.raw_output_contents):
            out[spec.name] = np.frombuffer(data, dtype=DTYPES[spec.datatype]).reshape(tuple(spec.shape))
        return out
    except Exception as exc:  # protobuf's DecodeError, a datatype or a shape that does not fit
        raise ServerError(f"malformed inference response: {type(exc).__name__}: {exc}") from None


def status_error(code: str | None, details: str) -> ServerError:
    """The client's error for a gRPC status (by name; None: no status at all)."""
    text = f"{code or 'gRPC error'}: {details}"
    if code in DENIED or details.startswith(RESTRICTED):
        return AccessDenied(text)
    return ServerUnavailable(text) if code in UNAVAILABLE else ServerError(text)
