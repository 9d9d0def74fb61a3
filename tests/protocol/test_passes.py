"""The timed passes where the server answers wrongly: a failure the real target cannot show, so a
stand-in answers here (the real server is driven in test_cli.py)."""

import itertools

import numpy as np
import pytest

from hstu_replay.client.triton import InferResponse
from hstu_replay.interface import Limits
from hstu_replay.protocol.cases import ProtocolUser, make_cases
from hstu_replay.protocol.passes import Caller, run_passes
from hstu_replay.request import UserRequest


def _users(n: int) -> list[ProtocolUser]:
    return [ProtocolUser(UserRequest(u, (1, 1, 1, 1, 1), np.arange(5, dtype=np.int64), np.ones(5, np.int64),
                                     np.arange(2, dtype=np.int64) + 50), np.full((2, 8), u, np.float32))
            for u in range(n)]


def test_wrong_cached_answers_are_mismatches_and_only_the_calls_are_timed():
    cases = make_cases(_users(8), 2, None, Limits(), nonce=1)  # warm-up + 3 measured calls
    by_keys = {tuple(c.tensors.user_ids): c for c in cases}
    sent = []

    def infer(tensors):
        sent.append(tensors)
        case = by_keys[tuple(tensors.user_ids)]
        wrong = len(sent) > 1 + 3  # the second pass answers 0.5 off
        cached = tensors.total_history_lengths if wrong else np.zeros(2, np.int64)
        return InferResponse(case.reference + (0.5 if wrong else 0.0), cached, 0.001)

    ticks = itertools.chain([0.0, 10.0, 20.0, 25.0])  # start/end of pass 1, then of pass 2
    results = run_passes(Caller(infer, lambda: None), "m", cases, caches=True, sleep_s=0.0,
                         clock=lambda: next(ticks))
    cold, cached = results
    assert len(sent) == 1 + 2 * 3 and sent[0] is cases[0].tensors  # the warm-up once, never measured
    assert (cold.e2e_s, cached.e2e_s) == (10.0, 5.0)
    assert cold.ms_per_logical_request == pytest.approx(10_000 / 6)
    assert (cold.verified, cold.mismatches) == (3, 0)
    assert (cached.verified, cached.mismatches) == (6, 6)  # against the dump and against pass 1
    assert cached.max_abs_diff == pytest.approx(0.5)
    assert cold.cached_fraction == 0.0 and cached.cached_fraction == 1.0
    assert cached.server_calls is None  # statistics closed: said, not guessed


def test_a_count_read_while_the_server_still_books_the_last_call_is_waited_for():
    from hstu_replay.protocol.passes import settled_count

    reads = iter([10, 10, 11, 12, 12, 12])  # the server books two late calls
    assert settled_count(lambda: next(reads), at_least=12, poll_s=0.0) == 12
    reads = iter([7, 8, 8])
    assert settled_count(lambda: next(reads), poll_s=0.0) == 8  # two equal reads in a row
    assert settled_count(lambda: None) is None  # statistics closed: nothing to wait for
    late = iter(range(100, 10_000))
    assert settled_count(lambda: next(late), limit_s=0.05, poll_s=0.001) > 100  # never settles: bounded
