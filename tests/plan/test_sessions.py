"""Session replay keeps each target hit ratio through a sweep, whatever the visits' lengths."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.sessions import SessionSource, usable_users

SWEEP = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


@pytest.mark.parametrize("max_history", [64, 256])
def test_a_sweep_at_batch_1_achieves_every_target(long_store, max_history):
    store = SequenceStore.open(long_store)
    source = SessionSource(store, Dealer(usable_users(store, 16)), KeyAllocator(0, 0, nonce=1), 16,
                           Limits(max_history=max_history))
    for target in SWEEP:  # one source through the whole sweep, as a Locust user runs it
        hits = tokens = 0
        for _ in range(400):
            step = source.next_step(target, 1)
            hits += sum(step.expected_hits)
            tokens += int(step.request.total_history_lengths.sum())
        assert hits / tokens == pytest.approx(target, abs=0.03), (target, hits / tokens)
