"""Cost of building HSTU requests: a full-length batch of 8 (4096 history items + 100 candidates
each, 67,184 values) and its inverse, against a naive per-token Python layout for scale.

    python bench/request_build_bench.py [--repeats 2000]
"""

from __future__ import annotations

import argparse
import sys
import timeit

import numpy as np

from hstu_replay.interface import Limits
from hstu_replay.request import UserRequest, build_request


def users(batch: int, history: int, candidates: int) -> list[UserRequest]:
    rng = np.random.default_rng(0)
    return [UserRequest(1000 + b, (1, 2, 3, 4, 5), rng.integers(0, 10**7, history), rng.integers(0, 256, history),
                        rng.integers(0, 10**7, candidates)) for b in range(batch)]


def naive_values(batch: list[UserRequest]) -> list[int]:
    """The same layout token by token in Python: what 'no Python loops over tokens' avoids."""
    values = [u.user_id for u in batch]
    for f in range(5):
        values += [u.context[f] for u in batch]
    for u in batch:
        values += [int(x) for x in u.history_items] + [int(x) for x in u.candidates]
    for u in batch:
        values += [int(x) for x in u.history_actions] + [0] * len(u.candidates)
    return values


def per_call_us(fn, repeats: int) -> float:
    return min(timeit.repeat(fn, number=repeats, repeat=3)) / repeats * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    limits = Limits(max_values=70_000)
    print(f"command: {' '.join(sys.argv)}")
    print("| batch | history | candidates | values | build us | inverse us | naive Python us |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch, history, candidates in ((1, 4096, 100), (8, 4096, 100), (8, 1024, 100)):
        group = users(batch, history, candidates)
        request = build_request(group, limits)
        assert naive_values(group) == request.values.tolist()
        build = per_call_us(lambda: build_request(group, limits), args.repeats)
        inverse = per_call_us(request.users, args.repeats)
        naive = per_call_us(lambda: naive_values(group), max(args.repeats // 200, 3))
        print(f"| {batch} | {history} | {candidates} | {len(request.values):,} | {build:.1f} | {inverse:.1f} | {naive:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
