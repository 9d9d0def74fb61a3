"""The oracle's bookkeeping and layout checks by hand-worked numbers, and the oracle served over gRPC."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.oracle.server import Oracle, OracleCache, OracleError, RequestLog, parse_request, read_log

# ---------------------------------------------------------------------------------------------------------
# OracleCache


def test_hits_are_what_is_held_up_to_the_total():
    cache = OracleCache()
    assert cache.apply([1, 2], [10, 20]) == [0, 0]
    assert cache.held == {1: 10, 2: 20}
    assert cache.apply([1], [30]) == [10]  # grew: reuses its 10
    assert cache.held[1] == 30
    assert cache.apply([1, 2], [30, 20]) == [30, 20]  # same length again: everything reused
    assert cache.apply([3], [6]) == [0]
    # the raw rule, min(held, total); the server refuses such a request before it gets here
    assert cache.apply([1], [12]) == [12]
    assert cache.held[1] == 12


def test_shrinking_keys_are_named():
    cache = OracleCache()
    cache.apply([1, 2], [20, 20])
    assert cache.shrinking([1, 2, 3], [20, 19, 6]) == ["shrinking key: 2 total 19 < held 20"]
    assert cache.shrinking([1, 2], [26, 20]) == []


def test_unbounded_keeps_everything():
    cache = OracleCache(budget_tokens=0)
    for k in range(100):
        cache.apply([k], [4096 * 2 + 6])
    assert len(cache.held) == 100


def test_lru_eviction_counts_whole_pages():
    # budget 100 tokens, pages of 32: capacity 100 // 32 = 3 pages.
    #   A = 32 tokens -> ceil(32/32) = 1 page;  B = 33 tokens -> ceil(33/32) = 2 pages;  used 3 (fits)
    #   C = 6 tokens  -> 1 page; used 4 > 3 -> evict the least recently used, A; used 3.
    #   (By tokens it would have fitted: 32 + 33 + 6 = 71 <= 100.)
    cache = OracleCache(budget_tokens=100, page_tokens=32)
    assert cache.capacity_pages == 3
    cache.apply([10], [32])  # A
    cache.apply([11], [33])  # B
    assert cache.used_pages() == 3
    cache.apply([12], [6])  # C
    assert cache.held == {11: 33, 12: 6}
    # using B makes C the least recently used: D (6 tokens, 1 page) pushes C out, not B
    assert cache.apply([11], [33]) == [33]
    cache.apply([13], [6])  # D
    assert cache.held == {11: 33, 13: 6}
    assert cache.apply([10, 12], [32, 6]) == [0, 0]  # A and C were evicted


def test_request_keys_are_evicted_last_and_in_request_order():
    # capacity 3 pages of 32 tokens.
    cache = OracleCache(budget_tokens=96, page_tokens=32)
    cache.apply([1], [32])  # X: 1 page
    # request [A = 64 tokens (2 pages), B = 32 (1 page)]: used 1 + 2 + 1 = 4 -> X goes; A and B stay
    assert cache.apply([2, 3], [64, 32]) == [0, 0]
    assert cache.held == {2: 64, 3: 32}
    # request [A = 64, C = 64]: used B 1 + A 2 + C 2 = 5 -> B goes (not in the request): 4, still > 3;
    # only request keys remain -> drop them in request order: A goes, 2 pages left.
    assert cache.apply([2, 4], [64, 64]) == [64, 0]
    assert cache.held == {4: 64}


def test_a_key_larger_than_the_budget_is_served_but_not_kept():
    # capacity 3 pages of 32; 97 tokens -> 4 pages, more than the whole budget
    cache = OracleCache(budget_tokens=100, page_tokens=32)
    cache.apply([1], [32])
    assert cache.apply([2], [97]) == [0]
    assert cache.held == {1: 32}  # nothing else was evicted for it
    assert cache.apply([2], [97]) == [0]
    # exactly the budget (96 tokens, 3 pages) is kept, and everything older goes
    cache.apply([3], [96])
    assert cache.held == {3: 96}


def test_budget_smaller_than_a_page_keeps_nothing():
    cache = OracleCache(budget_tokens=31, page_tokens=32)
    assert cache.capacity_pages == 0
    assert cache.apply([1], [6]) == [0]
    assert cache.held == {}


# ---------------------------------------------------------------------------------------------------------
# Wire layout

# B = 2, feature-major:
#   user 0: store user 501, cache key 11, context 1..5, 2 history items + 1 candidate (L=3), total 6 + 2*2 = 10
#   user 1: store user 502, cache key 12, context 6..10, 0 history items + 2 candidates (L=2), total 6 + 2*0 = 6
VALUES = [
    501, 502,  # user_id
    1, 6,  # contextual feature 1
    2, 7,  # contextual feature 2
    3, 8,  # contextual feature 3
    4, 9,  # contextual feature 4
    5, 10,  # contextual feature 5
    900, 901, 902, 910, 911,  # video_id: user 0 (history 900, 901; candidate 902), user 1 (candidates 910, 911)
    1, 2, 0, 0, 0,  # action_weights, same lengths
]
LENGTHS = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 2, 3, 2]  # lengths[f*B + b]
CANDIDATES = [1, 2]
KEYS = [11, 12]
TOTALS = [10, 6]


def parse(values=VALUES, lengths=LENGTHS, candidates=CANDIDATES, keys=KEYS, totals=TOTALS, max_values=40000):
    return parse_request(np.array(values), np.array(lengths), np.array(candidates), np.array(keys),
                         np.array(totals), max_values=max_values)


def test_parses_a_hand_built_request():
    parsed = parse()
    assert parsed.violations == []
    assert parsed.keys == [11, 12]
    assert parsed.users == [501, 502]
    assert parsed.totals == [10, 6]
    assert parsed.candidates == [1, 2]
    assert parsed.histories == [2, 0]


def single_user(history: int, candidates: int) -> dict:
    n = history + candidates
    return dict(values=[7, 1, 2, 3, 4, 5] + [100] * n + [0] * n, lengths=[1] * 6 + [n, n],
                candidates=[candidates], keys=[70], totals=[6 + 2 * history])


def with_(i: int, value: int, seq: list[int]) -> list[int]:
    out = list(seq)
    out[i] = value
    return out


@pytest.mark.parametrize("changes, expected", [
    (dict(max_values=21), "limit: 22 values > 21"),
    (dict(totals=[10, 8]), "layout: user 1 total_history_length 8 != 6 + 2*0"),
    (dict(keys=[11, 11]), "duplicate key: 11"),
    (dict(values=with_(1, 501, VALUES)), "duplicate user: 501"),
    (dict(keys=[11]), "layout: 1 user_ids for 2 users"),
    (dict(totals=[10, 6, 6]), "layout: 3 total_history_lengths for 2 users"),
    (dict(lengths=LENGTHS[:-1]), "layout: 15 lengths for 2 users (expected 16)"),
    (dict(values=VALUES[:-1]), "layout: lengths sum to 22 but there are 21 values"),
    (dict(candidates=[1, 3], totals=[10, 4]), "layout: user 1 has 3 candidates but only 2 items"),
    (dict(candidates=[-1, 2]), "layout: negative num_candidates; layout: user 0 total_history_length 10 != 6 + 2*4"),
    (dict(lengths=with_(2, 2, LENGTHS), values=VALUES + [0]), "layout: feature 1 of user 0 has length 2 (expected 1)"),
    (dict(lengths=with_(15, 1, with_(13, 3, LENGTHS)), totals=[10, 8]),
     "layout: user 1 has 3 video_id and 1 action_weights values"),
])
def test_each_violation_is_detected(changes, expected):
    assert parse(**changes).violations == expected.split("; ")


def test_limits():
    assert parse(**single_user(4096, 100)).violations == []
    assert parse(**single_user(4097, 1)).violations == ["limit: user 0 has 4097 history items > 4096"]
    assert parse(**single_user(0, 101)).violations == ["limit: user 0 has 101 candidates > 100"]
    nine = parse(values=list(range(9)) + [0] * 63, lengths=[1] * 54 + [1] * 18, candidates=[1] * 9,
                 keys=list(range(9)), totals=[6] * 9)
    assert nine.violations == ["limit: batch size 9 outside 1..8"]
    empty = parse(values=[], lengths=[], candidates=[], keys=[], totals=[])
    assert empty.violations == ["limit: batch size 0 outside 1..8"]


def test_a_refused_request_is_recorded_and_not_applied(tmp_path: Path):
    log = RequestLog(tmp_path / "log.jsonl")
    oracle = Oracle(OracleCache(), log, cached_tokens=True)
    inputs = {f"INPUT__{i}": np.array(a) for i, a in enumerate([VALUES, LENGTHS, CANDIDATES, KEYS, TOTALS])}
    answer = oracle.handle(inputs)
    assert answer["OUTPUT__0"].shape == (3, 8)
    assert answer["OUTPUT__1"].tolist() == [-1, -1]
    assert answer["CACHED_TOKENS"].tolist() == [0, 0]
    # key 11 now holds 10 tokens; a request with 0 history items for it would shrink it
    shrinking = dict(inputs, INPUT__0=np.array(VALUES[:12] + [902, 910, 911, 0, 0, 0]),
                     INPUT__1=np.array(with_(12, 1, with_(14, 1, LENGTHS))), INPUT__4=np.array([6, 6]))
    with pytest.raises(OracleError, match="^oracle: shrinking key: 11 total 6 < held 10$"):
        oracle.handle(shrinking)
    assert oracle.cache.held == {11: 10, 12: 6}
    assert oracle.handle(inputs)["CACHED_TOKENS"].tolist() == [10, 6]
    log.close()
    records = read_log(tmp_path / "log.jsonl")
    assert [r["seq"] for r in records] == [0, 1, 2]
    assert [r["hits"] for r in records] == [[0, 0], [], [10, 6]]
    assert records[1]["violations"] == ["shrinking key: 11 total 6 < held 10"]
    assert records[1]["totals"] == [6, 6]


def test_read_log_skips_a_torn_last_line(tmp_path: Path):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"seq": 0}) + "\n" + '{"seq": 1, "ke')
    assert read_log(path) == [{"seq": 0}]


# ---------------------------------------------------------------------------------------------------------
# Served


@pytest.mark.integration
def test_served_oracle_answers_cached_tokens_and_records(oracle_servers):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    oracle = oracle_servers(cached_tokens=True)
    client = grpcclient.InferenceServerClient(oracle.grpc_url)
    before = len(oracle.records())

    def infer(values, lengths, candidates, keys, totals):
        inputs = []
        for i, data in enumerate([values, lengths, candidates, keys, totals]):
            tensor = grpcclient.InferInput(f"INPUT__{i}", [len(data)], "INT64")
            tensor.set_data_from_numpy(np.array(data, dtype=np.int64))
            inputs.append(tensor)
        return client.infer("hstu_gr_ranking_kvcache", inputs)

    # B=2: key 910001 (store user 8001) 2 history items + 1 candidate; key 910002 (user 8002) 1 + 1
    first = infer(
        [8001, 8002, 1, 6, 2, 7, 3, 8, 4, 9, 5, 10, 900, 901, 902, 910, 911, 1, 2, 0, 3, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 2, 3, 2],
        [1, 1], [910001, 910002], [10, 8])
    assert first.as_numpy("CACHED_TOKENS").tolist() == [0, 0]
    assert first.as_numpy("OUTPUT__0").shape == (2, 8)
    assert first.as_numpy("OUTPUT__1").tolist() == [-1, -1]
    # B=1: key 910001 again with 4 history items + 2 candidates: reuses its 10 tokens
    second = infer(
        [8001, 1, 2, 3, 4, 5, 900, 901, 902, 903, 904, 905, 1, 2, 1, 2, 0, 0],
        [1, 1, 1, 1, 1, 1, 6, 6],
        [2], [910001], [14])
    assert second.as_numpy("CACHED_TOKENS").tolist() == [10]
    assert second.as_numpy("OUTPUT__0").shape == (2, 8)
    # key 910002 with no history would shrink it from 8 to 6 tokens
    with pytest.raises(InferenceServerException, match="oracle: shrinking key: 910002 total 6 < held 8"):
        infer([8002, 1, 2, 3, 4, 5, 910, 0], [1, 1, 1, 1, 1, 1, 1, 1], [1], [910002], [6])

    records = oracle.records()[before:]
    assert [(r["keys"], r["users"], r["totals"], r["hits"], r["candidates"], r["violations"]) for r in records] == [
        ([910001, 910002], [8001, 8002], [10, 8], [0, 0], [1, 1], []),
        ([910001], [8001], [14], [10], [2], []),
        ([910002], [8002], [6], [], [1], ["shrinking key: 910002 total 6 < held 8"]),
    ]
    assert [r["seq"] for r in records] == list(range(before, before + 3))
    # refused, so not applied: the same key still reuses 8 tokens
    third = infer([8002, 1, 2, 3, 4, 5, 910, 911, 0, 0], [1, 1, 1, 1, 1, 1, 2, 2], [1], [910002], [8])
    assert third.as_numpy("CACHED_TOKENS").tolist() == [8]
