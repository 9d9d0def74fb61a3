"""A consistent-hash ring written from its definition, apart from hstu_replay.fleet.routing (linear
scan, no bisect, no shared code): points are the first 8 bytes (big-endian) of blake2b of
'address#replica', 160 per address; a key is spread by SplitMix64's finaliser and goes to the
first point at or after its hash, wrapping round."""

from __future__ import annotations

import hashlib

POINTS = 160
M = 2**64


def plain_mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) % M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % M
    return z ^ (z >> 31)


def plain_ring(addresses):
    """key -> index of its server in `addresses`."""
    points = []
    for i, a in enumerate(addresses):
        for r in range(POINTS):
            points.append((int.from_bytes(hashlib.blake2b(f"{a}#{r}".encode(), digest_size=8).digest(), "big"), i))

    def server(key: int) -> int:
        h = plain_mix(key)
        after = [(p, i) for p, i in points if p >= h]
        return min(after)[1] if after else min(points)[1]

    return server
