"""The two cache tiers in a run's report: per stage, the token hit ratio of each tier and the mix
of users by tier (GPU hit, host hit, miss), the client's prediction and, where the server sends
HOST_CACHED_TOKENS, the server's word; beside the target mix of a `--tier-mix` run.

`stage_tiers` is the `tiers` object of each `report.json` stage; `tier_table` the rows the terminal
and the HTML page show beside the hit-ratio table.
"""

from __future__ import annotations

import math

from hstu_replay.plan.tiers import Tier
from hstu_replay.output.text import NO_VALUE, fmt
from hstu_replay.stats.run_stats import BinStats

#: How far a steered stage's share of a tier may lie from its target mix.
MIX_TOLERANCE = 0.02


def _share(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


def _figures(s: BinStats, source: str, host_hits: int, hits: int, tokens: int) -> dict:
    users = {t: getattr(s, f"{source}_{t.value}_users") for t in Tier}
    total = sum(users.values())
    return {
        "gpu_ratio": _share(hits - host_hits, tokens),
        "host_ratio": _share(host_hits, tokens),
        "mix": {t.value: _share(n, total) for t, n in users.items()},
        "users": {t.value: n for t, n in users.items()},
    }


def tier_source(s: BinStats) -> str | None:
    """`observed`: the server said the tier of every measured user; `predicted`: the client's model."""
    if not s.history_tokens:
        return None
    return "observed" if s.observed_tier_tokens == s.history_tokens else "predicted"


def mix_distance(mix: dict, target: dict | None) -> float:
    """The largest gap between a tier's share and its target share (NaN without a target)."""
    if not target or any(mix.get(t) is None or math.isnan(mix[t]) for t in target):
        return math.nan
    return max(abs(mix[t] - target[t]) for t in target)


def stage_tiers(s: BinStats, target_mix: dict | None = None) -> dict:
    predicted = _figures(s, "predicted", s.predicted_host_hits, s.predicted_hits, s.history_tokens)
    observed = (_figures(s, "observed", s.observed_host_hits, s.observed_hits, s.observed_tier_tokens)
                if s.observed_tier_tokens else None)
    source = tier_source(s)
    achieved = observed if source == "observed" else predicted
    return {
        "source": source,
        "gpu_ratio": achieved["gpu_ratio"],
        "host_ratio": achieved["host_ratio"],
        "mix": achieved["mix"],
        "target_mix": target_mix,
        "mix_distance": mix_distance(achieved["mix"], target_mix),
        "predicted": predicted,
        "observed": observed,
    }


def mix_text(mix: dict | None) -> str:
    """A mix as --tier-mix spells it ('gpu:0.6,host:0.3,miss:0.1'); empty for none."""
    return ",".join(f"{k}:{v:g}" for k, v in mix.items()) if mix else ""


#: A stage's tier figures as flat columns (report.csv and the web tab), in this order.
TIER_COLUMNS = ("tier_source", "tier_gpu_ratio", "tier_host_ratio", *(f"tier_mix_{t.value}" for t in Tier),
                "tier_target_mix", "tier_mix_distance")


def tier_columns(stage: dict) -> dict[str, object]:
    """`TIER_COLUMNS` of one report stage: where its figures come from, the token hit ratio per tier,
    the share of users per tier, the target mix and the largest gap to it (None where not known)."""
    t = stage.get("tiers") or {}
    mix = t.get("mix") or {}
    figures = [t.get("source"), t.get("gpu_ratio"), t.get("host_ratio"), *(mix.get(tier.value) for tier in Tier),
               mix_text(t.get("target_mix")) or None, t.get("mix_distance")]
    return dict(zip(TIER_COLUMNS, figures))


#: how a table marks where a hit ratio came from: the server's word or the client's model
SOURCE_MARK = {"observed": "server", "predicted": "model", None: NO_VALUE}
TIER_HEADER = ["batch", "target", "gpu hit", "host hit", "from", "mix gpu", "mix host", "mix miss", "target mix",
               "p50 ms", "p99 ms", "ms/logical"]


def tier_table(report: dict) -> list[list[str]]:
    """Header plus one row per stage: token hit ratio per tier, the mix of users, latency."""
    rows = [list(TIER_HEADER)]
    for stage, b in zip(report["stages"], report["bins"]):
        t = stage.get("tiers")
        if not t:
            continue
        target = t.get("target_mix")
        rows.append([
            str(stage["batch_size"]),
            NO_VALUE if stage["target_ratio"] is None else f"{stage['target_ratio']:g}",
            fmt(t["gpu_ratio"], ".3f"), fmt(t["host_ratio"], ".3f"), SOURCE_MARK[t["source"]],
            *(fmt(t["mix"][tier.value], ".3f") for tier in Tier),
            mix_text(target) or NO_VALUE,
            fmt(b["p50_ms"], ".2f"), fmt(b["p99_ms"], ".2f"), fmt(b["ms_per_logical_request"], ".3f"),
        ])
    return rows


def shows_tiers(report: dict) -> bool:
    """Whether the run had two tiers to speak of: a host tier (given, or read from the server), a target
    mix, or host hits in some stage. A server that reports tiers but has no host tier (the reference
    target at its default) adds nothing beside the hit-ratio table."""
    run = report.get("run") or {}
    options = run.get("options") or {}
    return bool(options.get("host_budget_tokens") or options.get("tier_mix")
                or any(((stage.get("tiers") or {}).get("host_ratio") or 0) > 0 for stage in report.get("stages", [])))
