"""A run's records joined, request by request, with what an oracle server saw of them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable


def oracle_view(records: list[dict], seen: list[dict],
                group: Callable[[dict], object] = lambda r: r["stage"]) -> dict:
    """Per stage (or per `group` of a record): (hits, history tokens) the oracle saw on the run's
    measured requests; every answered request of `records` must be in `seen`.

    Requests are joined by their tuple of cache keys, in order: a key has one request in flight
    at a time, so each side lists a key tuple's requests in the same order.
    """
    by_keys: dict[tuple, list[dict]] = defaultdict(list)
    for entry in seen:
        by_keys[tuple(entry["keys"])].append(entry)
    cursor: dict[tuple, int] = defaultdict(int)
    totals: dict = defaultdict(lambda: [0, 0])
    for record in sorted((r for r in records if r["ok"]), key=lambda r: r["t"]):  # in send order
        keys = tuple(record["keys"])
        entry = by_keys[keys][cursor[keys]]
        cursor[keys] += 1
        assert sum(entry["totals"]) == record["tokens"], (record, entry)
        if record["kind"] == "measure":
            totals[group(record)][0] += sum(entry["hits"])
            totals[group(record)][1] += sum(entry["totals"])
    return {stage: (h, t) for stage, (h, t) in totals.items()}
