"""Which stages' figures are not solid, and why: failed requests, wrong answers, too few samples,
a missed hit ratio, a busy client.

A flag never hides a figure: the stage keeps its numbers and carries the flags beside them in
every output; a run with thresholds fails on any flagged stage, but for the failures a threshold
set to count them allows (report.thresholds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS
from hstu_replay.report.tier_section import MIX_TOLERANCE, stage_tiers
from hstu_replay.stats.run_stats import BinKey, BinStats

#: The least distance from its target at which a stage's achieved hit ratio is off target.
RATIO_TOLERANCE = 0.005


#: A server whose p99 exceeds this many times the median p99 of the others breaks alone: the hot shard.
HOT_SHARD_P99_FACTOR = 2.0

ERRORS = "errors"  # a measured request of the stage got no answer
MISMATCHES = "mismatches"  # an answer of the stage differed from its reference

#: What each flag means for the stage's figures, in words (reports explain the flags they show).
#: The failures come first: they outrank every other flag of a stage.
FLAG_MEANINGS = {
    ERRORS: "measured requests failed (no answer: an error, a timeout, a malformed answer): the figures are "
            "those of the requests that were answered; the causes are in the errors",
    MISMATCHES: "answers differed from their reference by more than --tolerance: the stage measured wrong answers",
    "thin": "fewer measured requests than --min-stage-requests: its percentiles rest on too few samples",
    "off-target": "the achieved hit ratio lies farther from the target than max(0.005, one cache page / mean "
                  "history tokens), or (steered by --tier-mix) the share of users of a tier lies more than 0.02 "
                  "from its target: the stage measured another operating point than the one asked for",
    "client-bound": "a load-generator process used >= 90% of a core, or its event loop ran late: the client's "
                    "own queueing may read as server latency",
    "server-down": "the server was unreachable for part of the stage: its figures mix outage and service",
    "worker-lost": "a worker of the distributed run was lost during or before the stage: from then on it ran "
                   "with fewer users than asked for, another operating point",
    "hot-shard": f"one server of the fleet failed requests, or its p99 (the low end of its 95% interval) was over "
                 f"{HOT_SHARD_P99_FACTOR:g}x the other servers' median, while the others did not: the fleet's capacity is that server's",
    "server-lost": "a server of the fleet was unreachable for part of the stage: its users' requests failed there "
                   "while the run went on with the rest",
    "interrupted": "a signal (Ctrl-C, SIGTERM) ended the run during the stage: its figures cover part of its "
                   "window, and the stages after it never ran",
}


@dataclass(frozen=True)
class StageRules:
    min_requests: int = 30  # measured requests below which a stage is thin
    page_tokens: int = DEFAULT_PAGE_TOKENS  # the server's cache page: hits are lost and found in pages
    client_cpu_bound: float = 0.9  # a load-generator process this busy (1.0 = one core) queues requests
    loop_lag_bound_ms: float = 50.0  # the client's event loop this late (p99) delays sends and receipts
    tier_mix: tuple[tuple[str, float], ...] = ()  # --tier-mix: (tier, share) pairs; a stage is judged on it


def ratio_tolerance(mean_history_tokens: float, page_tokens: int) -> float:
    """How far a stage's achieved ratio may lie from its target: 0.005, or one cache page of a
    mean history where that is coarser (hits are planned in whole items, evicted in pages)."""
    return max(RATIO_TOLERANCE, page_tokens / mean_history_tokens if mean_history_tokens else 0.0)


def stage_flags(key: BinKey, s: BinStats, rules: StageRules) -> list[dict]:
    """[{"flag": name, "reason": one line}] for the stage; empty when its figures are solid."""
    flags = []
    if s.errors:
        flags.append((ERRORS, f"{s.errors} of {s.requests + s.errors} measured requests failed"))
    if s.mismatches:
        flags.append((MISMATCHES, f"{s.mismatches} of {s.verified} verified answers differ from their reference"))
    if s.requests < rules.min_requests:
        flags.append(("thin", f"{s.requests} measured requests < {rules.min_requests}"))
    if s.requests and rules.tier_mix:
        tiers = stage_tiers(s, dict(rules.tier_mix))
        if not tiers["mix_distance"] <= MIX_TOLERANCE:
            shown = ", ".join(f"{k} {v:.3f}" for k, v in tiers["mix"].items())
            flags.append(("off-target", f"achieved tier mix {shown} ({tiers['source']}) is {tiers['mix_distance']:.3f} "
                                        f"from its target (tolerance {MIX_TOLERANCE})"))
    elif s.requests and s.logical_requests:
        tolerance = ratio_tolerance(s.history_tokens / s.logical_requests, rules.page_tokens)
        miss = abs(s.achieved_ratio - key.goal_ratio)
        if miss > tolerance:
            flags.append(("off-target", f"achieved hit ratio {s.achieved_ratio:.3f} ({s.hit_source}) is "
                                        f"{miss:.3f} from its target {key.goal_ratio:g} (tolerance {tolerance:.3f})"))
    lag_p99 = s.loop_lag.percentile_ms(99)
    if s.client_cpu_peak >= rules.client_cpu_bound:
        flags.append(("client-bound", f"a load-generator process used {s.client_cpu_peak:.0%} of a core "
                                      f"(bound {rules.client_cpu_bound:.0%})"))
    elif not math.isnan(lag_p99) and lag_p99 > rules.loop_lag_bound_ms:
        flags.append(("client-bound", f"the client's event loop ran {lag_p99:.1f} ms late at p99 "
                                      f"(bound {rules.loop_lag_bound_ms:g} ms)"))
    if s.server_down_s > 0:
        flags.append(("server-down", f"the server was unreachable for {s.server_down_s:.1f} s"))
    return [{"flag": f, "reason": r} for f, r in flags]
