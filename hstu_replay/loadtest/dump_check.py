"""A dump checked before the load: its first answers, asked of every server, against the dump's.

A dump written by other weights than the served model's would fail every verified request of the
run; its first few requests tell before any stage starts. They are cold requests on keys no stage
uses (the worker's last virtual-user slot, under a nonce of their own): no stage counts them, and
on a server whose cache is bounded they are the first it evicts, so the stages' keys fare as the
client's cache model predicts.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hstu_replay.client.limits import limit_refusal
from hstu_replay.client.triton import ModelBinding, TritonClient
from hstu_replay.errors import ConfigError, HstuReplayError, ServerError
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.plan.keys import MAX_USERS_PER_WORKER, KeyAllocator
from hstu_replay.verify import largest_difference

if TYPE_CHECKING:
    from hstu_replay.loadtest.prepare import Placement
    from hstu_replay.plan.workloads import Workload

#: requests of the largest batch size compared before the load
CHECKED_REQUESTS = 2
#: what writes dumps that match a served repository
DUMP_COMMAND = "hstu-replay server dump --repository <the served repository> --store <store> --out <dir>"


def check_dump_answers(config: LoadTestConfig, placement: Placement, binding: ModelBinding,
                       workload: Workload) -> None:
    """One line (exit 2) where a server's answer to one of the data's first known answers differs
    beyond --tolerance, or the server refuses it for a limit; nothing where the data holds no answers
    or nothing is verified. A request that fails otherwise (a timeout, a server away) says so in one
    line and leaves the check to the load, where every failure is counted."""
    if config.checks.verify_fraction <= 0:
        return
    keys = KeyAllocator(placement.worker_index, MAX_USERS_PER_WORKER - 1)
    known = workload.known_answers(max(config.sweep.batches), CHECKED_REQUESTS, keys)
    addresses = config.target.addresses
    for server, address in enumerate(addresses if known else ()):
        where = "" if len(addresses) == 1 else f"server {address}: "
        client = TritonClient(config.target.client_options(server))
        client.binding = binding
        try:
            for answer in known:
                try:
                    logits = client.infer(answer.request).logits
                except HstuReplayError as exc:
                    refused = limit_refusal(str(exc))
                    if refused is None:  # the server's state, not the dump's: the load shows it
                        said = str(exc).strip().splitlines()[0]
                        print(f"hstu-replay: {where}the dump's answers could not be checked before the load "
                              f"({said}); they are checked as the load goes", file=sys.stderr, flush=True)
                        return
                    raise ServerError(f"{where}--dump-dir {config.data.path}: the dump's first request, sent "
                                      f"before the load to check its answers, was refused: {refused.line()}") from None
                worst = largest_difference(logits, answer.reference, answer.request.num_candidates)
                tolerance = config.checks.tolerance
                if worst is not None and worst.size > tolerance:
                    user = int(answer.request.users()[worst.user].user_id)
                    raise ConfigError(f"{where}--dump-dir {config.data.path}: the served model does not answer as "
                                      f"the dump says, before any load: {answer.labels[worst.user]} (user {user}), "
                                      f"{worst.line(tolerance)}; the dump was written by other weights than the "
                                      f"served model's: write matching dumps against the same repository with "
                                      f"`{DUMP_COMMAND}`")
        finally:
            client.close()
