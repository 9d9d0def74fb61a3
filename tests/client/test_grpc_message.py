"""The hand-written ModelInferRequest encoding, read back by protobuf's generated class."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc.service_pb2 import ModelInferRequest

from hstu_replay.client.grpc_message import encode_parts, encode_request, same_buffers, varint


@pytest.mark.parametrize("n, encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"),
                                        (300, b"\xac\x02"), (537_472, b"\x80\xe7\x20")])
def test_varints_by_hand(n, encoded):
    assert varint(n) == encoded


def test_protobuf_reads_back_every_field_and_byte():
    rng = np.random.default_rng(0)
    values = [rng.integers(-2**40, 2**40, n) for n in (6, 0, 5000, 17, 3)]  # pieces, one empty
    inputs = [("INPUT__0", tuple(values)), ("INPUT__1", (np.arange(16, dtype=np.int64),)),
              ("INPUT__3", (np.array([7, 2**62], dtype=np.int64),))]
    message = ModelInferRequest.FromString(encode_request("hstu_gr_ranking_kvcache", inputs,
                                                          ("OUTPUT__0", "CACHED_TOKENS")))
    assert message.model_name == "hstu_gr_ranking_kvcache"
    assert [(t.name, t.datatype, list(t.shape)) for t in message.inputs] == [
        ("INPUT__0", "INT64", [5026]), ("INPUT__1", "INT64", [16]), ("INPUT__3", "INT64", [2])]
    assert [o.name for o in message.outputs] == ["OUTPUT__0", "CACHED_TOKENS"]
    sent = [np.frombuffer(raw, dtype="<i8") for raw in message.raw_input_contents]
    np.testing.assert_array_equal(sent[0], np.concatenate(values))
    np.testing.assert_array_equal(sent[1], np.arange(16))
    np.testing.assert_array_equal(sent[2], [7, 2**62])


def test_the_same_buffers_are_the_same_arrays_not_equal_ones():
    a = np.arange(10, dtype=np.int64)
    b = np.arange(3, dtype=np.int64)
    inputs = [("INPUT__0", (a, b)), ("INPUT__1", (b,))]
    assert same_buffers(inputs, [("INPUT__0", (a, b)), ("INPUT__1", (b,))])
    assert not same_buffers(inputs, [("INPUT__0", (a.copy(), b)), ("INPUT__1", (b,))])  # equal, not the same
    assert not same_buffers(inputs, [("INPUT__0", (a, b)), ("INPUT__2", (b,))])
    assert not same_buffers(inputs, [("INPUT__0", (a,)), ("INPUT__1", (b,))])
    assert not same_buffers(inputs, inputs[:1])
    assert not same_buffers(inputs, ())


def test_the_message_as_buffers_is_the_joined_message_and_says_its_size():
    pieces = (np.arange(3, dtype=np.int64), np.array([], dtype=np.int64), np.arange(200, dtype=np.int64))
    inputs = [("INPUT__0", pieces),
              ("INPUT__1", (np.array([5], dtype=np.int64),))]
    message = encode_parts("m", inputs, ("OUTPUT__0",))
    joined = b"".join(memoryview(p).cast("B").tobytes() for p in message.parts)
    assert joined == encode_request("m", inputs, ("OUTPUT__0",))
    assert message.size == len(joined) == ModelInferRequest.FromString(joined).ByteSize()
    assert any(p is inputs[0][1][2] for p in message.parts)  # the pieces themselves, not copies
