"""The hit-ratio-vs-budget curve of a store's natural replay: the store opened, its trace built,
the one-pass curve (`cache_curve`) and, with an offload mode, the two-tier one (`tier_curve`).

`plan cache-curve` writes it out (`analysis.curve_files`); `capacity natural` and the benches read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.data.store import open_store
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits
from hstu_replay.analysis.cache_curve import CacheCurve, cache_curve
from hstu_replay.plan.over_limit import HistoryPolicy
from hstu_replay.analysis.tier_curve import TierCurve, tier_curve
from hstu_replay.plan.timeline import build_trace, group_requests


@dataclass(frozen=True)
class CurveOptions:
    store: str
    candidates: int = 16
    limits: Limits = Limits()
    batch_size: int = 1
    slice_ms: int = 0
    page_tokens: int = DEFAULT_PAGE_TOKENS
    policy: HistoryPolicy = HistoryPolicy()
    offload_chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS  # the host tier's, under native offload


def store_curve(options: CurveOptions) -> tuple[CacheCurve, dict]:
    """The curve of a store's natural replay; and what was computed (trace size, seconds)."""
    curve, _, info = store_curves(options)
    return curve, info


def store_curves(options: CurveOptions, offload_mode: str | None = None) -> tuple[CacheCurve, TierCurve | None, dict]:
    """The one-tier curve of a store's natural replay and, with an offload mode, its two-tier curve."""
    store = open_store(options.store)
    if options.limits.history_cap(options.batch_size, options.candidates) < 1:
        raise ConfigError(f"--max-values {options.limits.max_values}: no room for any history at batch "
                          f"{options.batch_size} with --candidates {options.candidates}")
    began = time.perf_counter()
    trace = build_trace(store, options.candidates, options.limits, options.batch_size, options.policy)
    if not len(trace):
        raise ConfigError(f"--store {options.store}: no user comes back after a gap of 60 s; nothing to replay")
    bounds = group_requests(trace, options.slice_ms, options.batch_size)
    keys, tokens = trace.cache_keys, trace.tokens
    info = {"store": str(options.store), "users": int(np.count_nonzero(np.bincount(trace.users))), "visits": len(trace),
            "history_cap": trace.history_cap, "span_ms": int(trace.times_ms[-1] - trace.times_ms[0]),
            "visit_kinds": trace.accounts().to_dict(options.policy)}
    del trace  # the passes need only the keys, tokens and requests: the trace's columns go first
    curve = cache_curve(keys, tokens, bounds, options.page_tokens)
    tiers = (tier_curve(keys, tokens, bounds, options.page_tokens, offload_mode, options.offload_chunk_tokens)
             if offload_mode else None)
    info["seconds"] = round(time.perf_counter() - began, 3)
    return curve, tiers, info
