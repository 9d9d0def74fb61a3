"""The fault proxy's own reading of HTTP/2 frames, on hand-written bytes."""

from __future__ import annotations

from tests.client.fault_proxy import H2_PREFACE, Frames

SETTINGS = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x02\x00\x00\x00\x00"  # 6 bytes, type 4: [0, 15)
HEADERS = b"\x00\x00\x02\x01\x04\x00\x00\x00\x01" + b"\x82\x86"  # 2 bytes, type 1, stream 1: [15, 26)
DATA = b"\x00\x00\x03\x00\x01\x00\x00\x00\x01" + b"abc"  # 3 bytes, type 0, END_STREAM: [26, 38)


def test_frames_are_found_in_a_chunk_after_the_preface():
    assert Frames(len(H2_PREFACE)).scan(H2_PREFACE + SETTINGS + HEADERS + DATA) == ([24, 39, 50], [4, 1, 0])


def test_frames_split_across_chunks_are_followed():
    stream = SETTINGS + HEADERS + DATA
    frames = Frames()
    assert frames.scan(stream[:4]) == ([0], [])
    assert frames.scan(stream[4:20]) == ([11], [4])  # HEADERS starts at 15, its head ends in the next chunk
    assert frames.scan(stream[20:]) == ([6], [1, 0])
