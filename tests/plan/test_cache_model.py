"""The client's cache model stays as small as the keys in use: retired keys are forgotten."""

from __future__ import annotations

import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.cache_model import CacheModel
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.dumps import DumpSource, pool_identities
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.sessions import SessionSource, usable_users
from tests.plan.test_perf_analyzer import dump_pool


def replay(source, model: CacheModel, ratios, steps: int, batch: int) -> int:
    """Plan, predict and settle as a Locust user does; the most keys the model ever held."""
    most = 0
    for i in range(steps):
        step = source.next_step(ratios[i % len(ratios)], batch)
        for request in (step.prime, step.request):
            if request is not None:
                model.predict(request)
        model.retire(source.settle(step, True))
        most = max(most, len(model.ledger))
    return most


@pytest.mark.parametrize("ratios", [(0.0,), (0.5,), (1.0,), (0.0, 0.9, 1.0)])
def test_dump_replay_keeps_one_key_per_dumped_user_at_most(ratios):
    pool = dump_pool(users=12, repeats=2)
    source = DumpSource(pool, Dealer(range(len(pool)), identities=pool_identities(pool)), {},
                        KeyAllocator(0, 0, nonce=4), Limits(max_history=256))
    assert replay(source, CacheModel(None, 32), ratios, 2000, 4) <= len(pool)


def test_session_replay_keeps_one_key_per_slot(long_store):
    store = SequenceStore.open(long_store)
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=4), 16,
                           Limits(max_history=64))
    assert replay(source, CacheModel(None, 32), (0.0, 0.5, 0.9), 3000, 4) <= 4


def test_under_a_budget_retired_keys_stay_as_the_server_keeps_them():
    pool = dump_pool(users=12)
    source = DumpSource(pool, Dealer(range(len(pool)), identities=pool_identities(pool)), {},
                        KeyAllocator(0, 0, nonce=4), Limits(max_history=256))
    model = CacheModel(budget_tokens=10**9, page_tokens=32)
    replay(source, model, (0.0,), 50, 4)
    assert len(model.ledger) == 200  # every key sent, as on the server, until its LRU evicts them
