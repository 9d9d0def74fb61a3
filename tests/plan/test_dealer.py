"""The dealer: distinct users per request, spread over slots and workers, bounded."""

from __future__ import annotations

import pytest

from hstu_replay.errors import PlanError
from hstu_replay.plan.dealer import Dealer


def test_held_users_are_skipped_while_others_are_free():
    dealer = Dealer(range(10), seed=1)
    taken = [dealer.take() for _ in range(10)]
    assert sorted(taken) == list(range(10))  # ten slots, ten different users
    dealer.release(taken[3])
    assert dealer.take() == taken[3]  # the only free one


def test_a_request_never_holds_one_user_twice_even_when_all_are_held():
    dealer = Dealer(range(3))
    for _ in range(3):
        dealer.take()
    first = dealer.take()
    second = dealer.take(exclude={first})
    assert second != first
    with pytest.raises(PlanError, match="3 users cannot fill a batch of 4"):
        dealer.take(exclude={0, 1, 2})


def test_identities_group_items_of_one_user():
    # items 0 and 1 are the same store user (dumped twice)
    dealer = Dealer(range(3), identities=[7, 7, 8])
    a = dealer.take()
    b = dealer.take(exclude={dealer.identity(a)})
    assert dealer.identity(a) != dealer.identity(b)


def test_workers_start_at_evenly_spaced_points_of_one_order():
    order = Dealer(range(100), seed=3).order
    assert Dealer(range(100), seed=3, worker_index=1, worker_count=4).order == order[25:] + order[:25]
    firsts = {Dealer(range(100), seed=3, worker_index=w, worker_count=4).take() for w in range(4)}
    assert len(firsts) == 4
