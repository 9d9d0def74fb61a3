"""Per-server figures from each backend's metrics equal what each server's answers said (CACHED_TOKENS)."""

from __future__ import annotations

import time

import pytest

from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.metrics.backends import BackendMetrics, ServerFigures
from hstu_replay.fleet.local import Backend
from hstu_replay.interface import history_tokens
from hstu_replay.request import build_request
from tests.fleet.conftest import history_user

#: per server: the visits (history items, cache key) sent straight to it; unequal, so that a mix-up shows
VISITS = ([(12, 8_100_001), (24, 8_100_001), (30, 8_100_002)],
          [(16, 8_100_003), (16, 8_100_003), (40, 8_100_003), (8, 8_100_004), (20, 8_100_004)])
TRITON_COUNT_WAIT_S = 10.0  # Triton counts a request once its answer is sent: the count can trail the answer


def test_a_server_not_scraped_has_no_figures():
    metrics = BackendMetrics([Backend("127.0.0.1:1", "127.0.0.1:2", None, None)])
    snapshot = metrics.snapshot()
    assert metrics.figures(snapshot, snapshot) == (ServerFigures(0, None, None, None, None, None),)


@pytest.mark.integration
def test_figures_are_what_each_server_answered(fleet):
    metrics = BackendMetrics(fleet.backends)
    before = metrics.snapshot()
    answered = []  # per server: (hit tokens, computed tokens) as its answers said
    for backend, visits in zip(fleet.backends, VISITS):
        client = TritonClient(ClientOptions(url=backend.grpc))
        try:
            hits = [int(client.infer(build_request([history_user(key % 97, items, key)])).cached_tokens[0])
                    for items, key in visits]
        finally:
            client.close()
        answered.append((sum(hits), sum(history_tokens(items) for items, _ in visits) - sum(hits)))
    assert answered[0][0] > 0 and answered[1][0] > 0  # revisits hit: the ratio is not trivially 0
    deadline = time.monotonic() + TRITON_COUNT_WAIT_S
    while True:
        figures = metrics.figures(before, metrics.snapshot())
        if [f.request_success for f in figures] == [len(v) for v in VISITS] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [f.server for f in figures] == [0, 1]
    assert [f.requests for f in figures] == [len(v) for v in VISITS]
    assert [f.request_success for f in figures] == [len(v) for v in VISITS]
    assert [(f.hit_tokens, f.computed_tokens) for f in figures] == answered
    assert [f.hit_ratio for f in figures] == pytest.approx([hit / (hit + computed) for hit, computed in answered])
