"""Natural replay: users come back when the log says they do, so the KV-cache hit ratio is not
chosen but whatever the server's cache holds (`--workload timeline`, `plan cache-curve`,
`capacity natural`; docs/guides/natural-replay.md).

Its pieces stay in the layer each belongs to (request planning is core, the Locust glue and the
capacity search sit above it); `PIECES` names every one and where it lives, in the order a
replay meets them. tests/test_natural.py checks that each exists and that every module reading
the replay's own modules is named here.
"""

from __future__ import annotations

#: module -> what it does for a natural replay
PIECES: dict[str, str] = {
    "hstu_replay.plan.timeline": "the trace (every visit with a history, in the log's time order), requests "
                                 "grouped by time slice, shards of the users, and the `Timeline` that hands "
                                 "requests to virtual users in order (`TimelineSource`); request labels read back",
    "hstu_replay.plan.over_limit": "`--over-limit`: what a visit past the history limit sends (skip, oldest, "
                                   "rebase), and the visits counted by kind",
    "hstu_replay.plan.waiting": "how a virtual user waits for the earlier requests of its users: given from "
                                "outside (plain threads by default)",
    "hstu_replay.plan.workloads": "`--workload timeline` in the workload registry (`TimelineWorkload`)",
    "hstu_replay.analysis.store_curve": "a store's computed hit-ratio-vs-budget curve, one tier and two "
                                        "(offline, `analysis.cache_curve` and `analysis.tier_curve`)",
    "hstu_replay.analysis.curve_files": "that curve as files: curve.json, the CSVs, curve.svg",
    "hstu_replay.analysis.cli": "`plan cache-curve`: the curve of a store, printed and written",
    "hstu_replay.loadtest.config": "the load test's natural-replay options in typed form (--time-scale, "
                                   "--time-slice-ms, --timeline-shard, --over-limit)",
    "hstu_replay.loadtest.waiting": "the load test's way of waiting: gevent's events and greenlets",
    "hstu_replay.loadtest.records": "each request's row (the hit ratio it met, its latency), kept for the report",
    "hstu_replay.loadtest.finish": "the report's natural section and natural_requests.csv, written at the end",
    "hstu_replay.report.natural": "that section: latency binned by the hit ratio met, both over time, the "
                                  "visits by kind",
    "hstu_replay.report.html": "the report page that shows the section",
    "hstu_replay.capacity.natural": "`capacity natural`: the smallest KV cache (and servers) that meets an SLO, "
                                    "budgets picked from the curve and each measured",
    "hstu_replay.capacity.shards": "one step of that search with n servers, from its shards' measurements",
    "hstu_replay.capacity.natural_page": "capacity_natural.html: every step, combined and shard by shard",
    "hstu_replay.capacity.cli": "the `capacity natural` command line",
}
