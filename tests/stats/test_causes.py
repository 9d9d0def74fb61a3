"""Failures counted by cause: hand-written messages of the forms the load generator files
(loadtest/user.py, client/), their causes written out by hand."""

from __future__ import annotations

import pytest

from hstu_replay.stats.causes import ErrorCause, cause_of
from hstu_replay.stats.run_stats import FURTHER_CAUSES, MAX_ERROR_REASONS, RunStats


@pytest.mark.parametrize("message, cause", [
    # a wrong answer of a sessions batch of 3 users (user.py: "mismatch in {label}: user {id} max |diff| ...")
    ("mismatch in user 1204 key 88 items 340; user 77 key 12 items 5; user 9 key 1 items 3: user 77 max |diff| 1.25 "
     "> 0.0625", "mismatch in user <id> key <key> items <n>; ...: user <id> max |diff| <n> > <n>"),
    # ... of a dump batch, whose shape was wrong (verify.py's reason)
    ("mismatch in batch_000002 user 3; batch_000002 user 4: user -1 max |diff| inf > 0.0625 shape [8, 16] != "
     "reference [8, 32]", "mismatch in batch_<n> user <id>; ...: user <id> max |diff| inf > <n> shape [<n>, <n>] != "
                          "reference [<n>, <n>]"),
    # the server's refusal of one user's history (gRPC status, client/grpc_message.py)
    ("INVALID_ARGUMENT: user 4417: history of 5120 items exceeds 4096",
     "INVALID_ARGUMENT: user <id>: history of <n> items exceeds <n>"),
    ("prime: UNAVAILABLE: cannot connect to 127.0.0.1:8001: [Errno 111] Connection refused",
     "prime: UNAVAILABLE: cannot connect to <addr>: [Errno <n>] Connection refused"),
    ("cannot connect to triton.example.net:8000: timed out", "cannot connect to <addr>: timed out"),
    ("UNAVAILABLE: connection lost: [::1]:8001 reset", "UNAVAILABLE: connection lost: <addr> reset"),
    ("INTERNAL: the answer's message says 1234 bytes, 100 came", "INTERNAL: the answer's message says <n> bytes, <n> came"),
    ("HTTP/1.1 protocol error: chunk size 0x1f00 over the limit", "HTTP/1.1 protocol error: chunk size <hex> over the limit"),
    # what names the kind of failure stays: an HTTP status, a protocol, a stage name
    ("HTTP 503: server busy", "HTTP 503: server busy"),
    ("not sent: its priming request failed", "not sent: its priming request failed"),
    ("planning: stage b8_h0.50 has no user left", "planning: stage b8_h0.50 has no user left"),
])
def test_a_cause_is_the_message_without_its_request(message, cause):
    assert cause_of(message) == cause


def test_one_cause_of_many_users_and_lengths_is_counted_once_with_an_example():
    stats = RunStats()
    for user, items in ((4417, 5120), (18, 4097), (4417, 6000)):
        stats.count_error(f"INVALID_ARGUMENT: user {user}: history of {items} items exceeds 4096")
    stats.count_error("HTTP 503: server busy")
    assert stats.errors == {
        "INVALID_ARGUMENT: user <id>: history of <n> items exceeds <n>":
            ErrorCause(3, "INVALID_ARGUMENT: user 4417: history of 5120 items exceeds 4096"),
        "HTTP 503: server busy": ErrorCause(1, "HTTP 503: server busy"),
    }


def test_causes_merge_across_processes_by_addition_through_the_wire():
    cause = "INVALID_ARGUMENT: user <id>: history of <n> items exceeds <n>"
    worker1, worker2, master = RunStats(), RunStats(), RunStats()
    worker1.count_error("INVALID_ARGUMENT: user 1: history of 5000 items exceeds 4096")
    worker1.count_error("INVALID_ARGUMENT: user 2: history of 5001 items exceeds 4096")
    worker2.count_error("INVALID_ARGUMENT: user 3: history of 5002 items exceeds 4096")
    worker2.count_error("timeout")
    for worker in (worker1, worker2):
        master.merge(RunStats.from_dict(worker.take().to_dict()))
    assert master.errors == {cause: ErrorCause(3, "INVALID_ARGUMENT: user 1: history of 5000 items exceeds 4096"),
                             "timeout": ErrorCause(1, "timeout")}
    assert worker1.errors == {}  # taken


def test_causes_past_the_limit_are_pooled():
    stats = RunStats()
    for i in range(MAX_ERROR_REASONS):
        stats.count_error(f"cause {chr(65 + i // 26)}{chr(65 + i % 26)}")  # letters: no numbers to hide
    stats.count_error("cause ZZ")
    stats.count_error("cause AA")  # a cause already kept is counted still
    assert len(stats.errors) == MAX_ERROR_REASONS + 1
    assert stats.errors[FURTHER_CAUSES] == ErrorCause(1, "cause ZZ")
    assert stats.errors["cause AA"].count == 2


def test_a_long_message_costs_about_its_length():
    # 100 KB bodies a server may send back: a pattern that backtracked took ~20 s here, one pass takes ~0.05 s
    import time

    for message in ("[" + "a:" * 50_000, "a b " * 25_000, "x.y-" * 25_000 + ":1", "user 1; " * 12_500):
        start = time.process_time()
        cause_of(message)
        assert time.process_time() - start < 2.0, message[:20]
