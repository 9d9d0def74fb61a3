"""Inference over gRPC through grpcio (`--triton-grpc-transport grpcio`), the message encoded
straight from the request's buffers (`grpc_message`): grpcio sends the bytes as they are."""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import numpy as np

from hstu_replay.client.grpc_message import METHOD, Inputs, RequestEncoder, decode_response, status_error

_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class GrpcInfer:
    def __init__(self, url: str, model: str, headers: dict[str, str], timeout_s: float,
                 credentials: grpc.ChannelCredentials | None = None):
        self.model, self.timeout_s = model, timeout_s
        self._channel = (grpc.secure_channel(url, credentials, options=_CHANNEL_OPTIONS) if credentials is not None
                         else grpc.insecure_channel(url, options=_CHANNEL_OPTIONS))
        self._call = self._channel.unary_unary(METHOD)  # bytes in, bytes out
        self._metadata = tuple((k.lower(), v) for k, v in headers.items()) or None
        self._encoder = RequestEncoder(model)

    def infer(self, inputs: Inputs, outputs: Sequence[str],
              extra: Sequence[tuple[str, str]] = ()) -> tuple[dict[str, np.ndarray], float]:
        """Send int64 `inputs` (name, contiguous pieces); returns the named outputs as arrays and
        the seconds the call took, from the encoded message handed over to the answer's bytes.
        `extra`: metadata of this request alone (a routing key)."""
        message = self._encoder.encode(inputs, outputs)
        metadata = (*(self._metadata or ()), *((k.lower(), v) for k, v in extra)) if extra else self._metadata
        start = time.monotonic()
        try:
            raw = self._call(message, timeout=self.timeout_s, metadata=metadata)
            seconds = time.monotonic() - start
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = str(exc.details() if callable(getattr(exc, "details", None)) else exc)
            raise status_error(code.name if code else None, details) from None
        return decode_response(raw), seconds

    def close(self) -> None:
        self._channel.close()
