"""The natural-replay trace: visits split as the session planner splits them, in time order."""

from __future__ import annotations

import numpy as np

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.over_limit import HistoryPolicy, OverLimit
from hstu_replay.plan.timeline import build_trace, by_server, group_requests

OLDEST = HistoryPolicy(OverLimit.OLDEST)


class _Times:
    """Just the store columns a trace reads: per-user event times."""

    def __init__(self, *users: list[int]):
        self.offsets = np.cumsum([0] + [len(u) for u in users])
        self.times_ms = np.concatenate([np.asarray(u, dtype=np.int64) for u in users])

    def __len__(self) -> int:
        return len(self.offsets) - 1


def test_a_hand_worked_trace():
    store = _Times([0, 1_000, 70_000, 71_000, 200_000], [5_000, 100_000, 100_500], [10, 20])
    trace = build_trace(store, candidates=1, limits=Limits(max_history=3), batch_size=1, policy=OLDEST)
    # user 0 comes back at 70 s (2 events before) and 200 s (4, capped at 3); user 1 at 100 s;
    # user 2 never leaves for 60 s, so it is never replayed; a gap of exactly 60 s splits.
    assert trace.users.tolist() == [0, 1, 0]
    assert trace.times_ms.tolist() == [70_000, 100_000, 200_000]
    assert trace.starts.tolist() == [2, 1, 4]
    assert trace.history.tolist() == [2, 1, 3]
    assert trace.candidates.tolist() == [1, 1, 1]
    assert trace.tokens.tolist() == [10, 8, 12]
    assert trace.kind.tolist() == [1, 1, 3]  # cold, cold, frozen (the oldest 3 of 4 items)
    # The default skips the visit past the limit, as NVIDIA's replay does; it is still counted.
    skipped = build_trace(store, candidates=1, limits=Limits(max_history=3), batch_size=1)
    assert skipped.users.tolist() == [0, 1] and skipped.skipped_times_ms.tolist() == [200_000]
    assert skipped.accounts().visits == (0, 2, 0, 0, 1) and skipped.accounts().tokens == (0, 18, 0, 0, 12)
    assert build_trace(_Times([0, 60_000]), 1, Limits(), 1).starts.tolist() == [1]
    assert len(build_trace(_Times([0, 59_999]), 1, Limits(), 1)) == 0


def test_requests_group_one_slice_of_distinct_users():
    store = _Times([0, 70_000, 140_000], [0, 100_000], [0, 110_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=8)
    assert trace.users.tolist() == [0, 1, 2, 0]  # at 70, 100, 110 and 140 s
    assert group_requests(trace, 0, 8).tolist() == [0, 1, 2, 3, 4]
    assert group_requests(trace, 1_000_000, 1).tolist() == [0, 1, 2, 3, 4]
    assert group_requests(trace, 1_000_000, 8).tolist() == [0, 3, 4]  # user 0 again: a new request
    assert group_requests(trace, 1_000_000, 2).tolist() == [0, 2, 4]
    assert group_requests(trace, 100_000, 8).tolist() == [0, 1, 4]  # slices [0,100) and [100,200) s


def test_over_a_fleet_a_slices_visits_go_server_by_server_each_user_in_log_order():
    store = _Times([0, 70_000, 140_000], [0, 100_000], [0, 110_000], [0, 120_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=8)
    assert trace.users.tolist() == [0, 1, 2, 3, 0]  # at 70, 100, 110, 120 and 140 s
    servers = np.array([1, 0, 1, 0])  # users 0 and 2 on server 1, users 1 and 3 on server 0
    ordered, visit_servers = by_server(trace, servers, 1_000_000)  # one slice
    assert ordered.users.tolist() == [1, 3, 0, 2, 0] and visit_servers.tolist() == [0, 0, 1, 1, 1]
    assert ordered.times_ms.tolist() == [100_000, 120_000, 70_000, 110_000, 140_000]
    # hand-worked: server 0's users together, then server 1's; user 0 again starts a request
    assert group_requests(ordered, 1_000_000, 8, visit_servers).tolist() == [0, 2, 4, 5]
    assert by_server(trace, servers, 0)[0].users.tolist() == trace.users.tolist()  # one visit a request: as logged


def test_a_store_trace_follows_every_users_visits(long_store):
    store = SequenceStore.open(long_store)
    trace = build_trace(store, candidates=16, limits=Limits(max_history=256), batch_size=8, policy=OLDEST)
    assert len(trace) > 100
    assert np.all(np.diff(trace.times_ms) >= 0)
    cap = Limits(max_history=256).history_cap(8, 16)
    assert trace.history_cap == cap
    for u in range(len(store)):
        times = np.asarray(store.user(u).times_ms)
        mine = trace.users == u
        starts = trace.starts[mine]
        assert np.all(np.diff(starts) > 0)  # each user's visits in its own order
        # every gap of 60 s or more starts a visit, and nothing else does
        gaps = [i for i in range(1, len(times)) if times[i] - times[i - 1] >= 60_000]
        assert starts.tolist() == gaps
        assert trace.history[mine].tolist() == [min(s, cap) for s in gaps]
        ends = gaps[1:] + [len(times)]
        assert trace.candidates[mine].tolist() == [min(e - s, 16) for s, e in zip(gaps, ends)]


def test_shards_of_shards_split_every_user_once(long_store):
    from hstu_replay.plan.timeline import shard_trace

    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    for n, workers in ((1, 2), (2, 2), (3, 2), (2, 3)):
        parts = [shard_trace(shard_trace(trace, i, n), w, workers, stride=n) for i in range(n) for w in range(workers)]
        assert sum(len(p) for p in parts) == len(trace)
        users = [set(p.users.tolist()) for p in parts]
        assert all(users) and sum(len(u) for u in users) == len(set(trace.users.tolist()))


def test_send_times_follow_the_log_scaled_or_the_rate():
    from hstu_replay.plan.timeline import Timeline

    store = _Times([0, 70_000, 140_000], [0, 100_000], [0, 110_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    bounds = group_requests(trace, 0, 1)
    scaled = Timeline(store, trace, bounds, 1, Limits(), time_scale=10.0)
    assert [scaled.send_at_s(r) for r in range(4)] == [0.0, 3.0, 4.0, 7.0]  # (70, 100, 110, 140 s - 70) / 10
    paced = Timeline(store, trace, bounds, 1, Limits(), request_rate=4.0)
    assert [paced.send_at_s(r) for r in range(4)] == [0.0, 0.25, 0.5, 0.75]
    assert Timeline(store, trace, bounds, 1, Limits()).send_at_s(3) is None


def test_a_users_next_visit_waits_for_its_last_answer():
    import gevent

    from hstu_replay.loadtest.waiting import GREENLETS
    from hstu_replay.plan.timeline import Timeline

    store = _Times([0, 70_000, 140_000], [0, 100_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    timeline = Timeline(store, trace, group_requests(trace, 0, 1), 1, Limits(), waiting=GREENLETS)
    assert trace.users.tolist() == [0, 1, 0]
    assert timeline.take() == 0 and timeline.take() == 1
    third = gevent.spawn(timeline.take)  # user 0 again: in flight since request 0
    gevent.sleep(0.05)
    assert not third.ready()
    timeline.release(1)
    gevent.sleep(0.05)
    assert not third.ready()
    timeline.release(0)
    assert third.get(timeout=1) == 2 and timeline.exhausted


def test_a_users_visits_go_in_log_order_whoever_takes_them_first():
    """Request 1 waits for request 0 of the same user; when 0 settles, a taker that comes before
    request 1's taker has run again must not jump ahead of it with request 2 (a longer history of
    the key sent before a shorter one)."""
    import gevent
    import pytest

    from hstu_replay.loadtest.waiting import GREENLETS
    from hstu_replay.plan.timeline import Timeline

    store = _Times([0, 70_000, 140_000, 210_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    timeline = Timeline(store, trace, group_requests(trace, 0, 1), 1, Limits(), waiting=GREENLETS)
    assert trace.users.tolist()[:3] == [0, 0, 0]
    assert timeline.take() == 0
    second = gevent.spawn(timeline.take)
    gevent.sleep(0.05)
    assert not second.ready()
    timeline.release(0)  # wakes the second taker, which has not run yet; this one takes first
    with pytest.raises(gevent.Timeout), gevent.Timeout(0.2):
        timeline.take()  # request 2: it waits for request 1 instead of going ahead of it
    assert second.get(timeout=1) == 1


def test_a_taker_stopped_while_waiting_lets_the_requests_behind_it_go():
    import gevent

    from hstu_replay.loadtest.waiting import GREENLETS
    from hstu_replay.plan.timeline import Timeline

    store = _Times([0, 70_000, 140_000, 210_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    timeline = Timeline(store, trace, group_requests(trace, 0, 1), 1, Limits(), waiting=GREENLETS)
    assert timeline.take() == 0
    stopped = gevent.spawn(timeline.take)  # request 1, waiting for request 0
    gevent.sleep(0.05)
    behind = gevent.spawn(timeline.take)  # request 2, waiting for request 1
    gevent.sleep(0.05)
    stopped.kill()  # as Locust stops a user
    timeline.release(0)
    assert behind.get(timeout=1) == 2


def test_outside_locust_a_taker_waits_on_a_plain_thread():
    import threading

    from hstu_replay.plan.timeline import Timeline

    store = _Times([0, 70_000, 140_000], [0, 100_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    timeline = Timeline(store, trace, group_requests(trace, 0, 1), 1, Limits())  # the default: threads
    assert timeline.take() == 0 and timeline.take() == 1
    taken = []
    third = threading.Thread(target=lambda: taken.append(timeline.take()), daemon=True)  # user 0 again
    third.start()
    third.join(0.05)
    assert third.is_alive() and taken == []
    timeline.release(0)
    third.join(1)
    assert taken == [2] and timeline.exhausted


def test_shards_keep_the_whole_logs_clock():
    from hstu_replay.plan.timeline import Timeline, shard_trace

    store = _Times([0, 70_000, 140_000], [0, 100_000])
    whole = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    second = shard_trace(whole, 1, 2)  # user 1 only: its visit at 100 s
    timeline = Timeline(store, second, group_requests(second, 0, 1), 1, Limits(), time_scale=10.0,
                        start_ms=int(whole.times_ms[0]))
    assert timeline.send_at_s(0) == 3.0  # 30 s after the whole log's first visit, not 0


class _Store(_Times):
    """A store with whole histories: user u has id 100 + u, items 10 x its event index."""

    def __init__(self, *users: list[int]):
        super().__init__(*users)
        self.user_ids = np.arange(len(users), dtype=np.int64) + 100

    def user(self, u: int):
        from hstu_replay.data.store import UserHistory

        n = int(self.offsets[u + 1] - self.offsets[u])
        return UserHistory(user_id=100 + u, context=(0, 0, 0, 0, 0), video_ids=np.arange(n, dtype=np.int64) * 10,
                           actions=np.ones(n, dtype=np.int64),
                           times_ms=self.times_ms[self.offsets[u]:self.offsets[u + 1]])


def test_a_failed_requests_user_continues_on_a_fresh_key():
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.timeline import Timeline, TimelineSource

    store = _Store([0, 70_000, 140_000, 210_000], [0, 100_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    assert trace.users.tolist() == [0, 1, 0, 0] and trace.tokens.tolist() == [8, 8, 10, 12]
    source = TimelineSource(Timeline(store, trace, group_requests(trace, 0, 1), 1, Limits()),
                            KeyAllocator(0, 0, nonce=1))
    steps = []
    for ok in (True, True, False, True):
        step = source.next_step(0.0, 1)
        steps.append((step, source.settle(step, ok)))
    (first, _), _, (failed, retired), (after, _) = steps
    key = int(first.request.users()[0].key)
    assert int(failed.request.users()[0].key) == key and failed.expected_hits == (8,)  # warm: extends 8 tokens
    assert retired == [key]  # the failure leaves the key's server state unknown: it is given up
    assert int(after.request.users()[0].key) != key and after.expected_hits == (0,)  # a fresh key hits nothing
    assert "user 100 visit at 140000 ms items 2 warm" in failed.label


def test_the_curve_after_a_failure_loses_what_the_replaced_key_held():
    from hstu_replay.analysis.cache_curve import cache_curve
    from hstu_replay.plan.timeline import after_failures, label_visits, visits_mask

    store = _Store([0, 70_000, 140_000, 210_000], [0, 100_000])
    trace = build_trace(store, candidates=1, limits=Limits(), batch_size=1)
    whole = cache_curve(trace.cache_keys, trace.tokens, group_requests(trace, 0, 1))
    assert (whole.hit_tokens(10_000), whole.total_tokens) == (8 + 10, 38)  # user 0's 2nd and 3rd visits hit
    failed = visits_mask(trace, store.user_ids, label_visits("user 100 visit at 140000 ms items 2 warm"))
    assert failed.tolist() == [False, False, True, False]
    lost = after_failures(trace, failed)
    assert lost.users.tolist() == [0, 1, 0] and lost.tokens.tolist() == [8, 8, 12]
    assert lost.cache_keys[2] != lost.cache_keys[0]  # the visit after the failure: a fresh key
    curve = cache_curve(lost.cache_keys, lost.tokens, group_requests(lost, 0, 1))
    assert (curve.hit_tokens(10_000), curve.total_tokens) == (0, 28)  # the failed visit is out, the next one cold
    assert after_failures(trace, np.zeros(4, dtype=bool)) is trace


def test_a_replayed_request_sends_what_the_store_holds_and_each_user_is_read_once(long_store):
    from hstu_replay.plan.keys import KeyAllocator
    from hstu_replay.plan.timeline import Timeline, TimelineSource

    store = SequenceStore.open(long_store)
    limits = Limits(max_history=256)
    trace = build_trace(store, candidates=16, limits=limits, batch_size=8, policy=OLDEST)
    timeline = Timeline(store, trace, group_requests(trace, 600_000, 8), 16, limits)
    reads = []
    real_user = store.user
    store.user = lambda i: (reads.append(i), real_user(i))[1]  # count the reads of the real store
    source = TimelineSource(timeline, KeyAllocator(0, 0, nonce=1))
    for _ in range(min(timeline.requests, 200)):
        step = source.next_step(0.0, 8)
        for u in step.request.users():  # against the store's own arrays, read separately
            i = store.index_of(u.user_id)
            ids, actions = real_user(i).video_ids, real_user(i).actions
            n, first = u.history_length, int(np.flatnonzero(ids == u.history_items[0])[0]) if u.history_length else 0
            np.testing.assert_array_equal(u.history_items, ids[first:first + n])
            np.testing.assert_array_equal(u.history_actions, actions[first:first + n].astype(np.int64))
        source.settle(step, True)
    assert len(reads) == len(set(reads)) > 0  # once per user, not once per visit


def test_a_shards_own_trace_is_its_share_of_the_whole(long_store):
    """Building only a shard's users gives the visits the whole trace's shard holds, column for
    column, and `first_visit_ms` the whole trace's first visit, without the whole trace."""
    from hstu_replay.plan.timeline import first_visit_ms, shard_trace, shard_users

    store = SequenceStore.open(long_store)
    for policy in (HistoryPolicy(), OLDEST):
        whole = build_trace(store, 16, Limits(max_history=256), 1, policy)
        assert first_visit_ms(store, 16, Limits(max_history=256), 1, policy) == int(whole.times_ms[0])
        for i, n, w, workers in ((0, 1, 0, 1), (1, 3, 0, 2), (2, 3, 1, 2), (5, 64, 0, 1)):
            expected = shard_trace(shard_trace(whole, i, n), w, workers, stride=n)
            mine = shard_users(len(store), i, n)
            mine = mine[np.isin(mine, shard_users(len(store), w, workers, stride=n))]
            own = build_trace(store, 16, Limits(max_history=256), 1, policy, users=mine)
            for name in ("users", "times_ms", "starts", "first", "history", "candidates", "kind", "epoch",
                         "skipped_users", "skipped_times_ms"):
                assert np.array_equal(getattr(own, name), getattr(expected, name)), (i, n, w, name)
