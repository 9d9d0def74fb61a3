"""What a natural replay does with a visit whose history is longer than the limit (`--over-limit`).

A user's history only grows; once it passes the longest history a request may carry, the
replay must choose, and the choice moves the cache curve by a factor of two on long logs:

- `skip` (default): the visit is not sent, nor is any later visit of that user. NVIDIA's KV-cache
  replay of KuaiRand-1K does this (a request whose history end passes the maximum is skipped).
- `oldest`: the first N items are sent, the rule of NVIDIA's evaluation path. Every later visit
  sends the same N items again on a warm key: a full hit that adds no token, labelled frozen.
- `rebase`: the latest items are sent on a fresh cache key (a full recompute), keeping
  `--rebase-keep` of the limit (default half); later visits append to that history until it
  passes the limit again. A fresh key because the server matches a key's cache by position only:
  a slid history on a warm key would reuse stale K/V.

Every visit is one of `KINDS`: warm (it extends what its key holds), cold (a user's first return:
nothing cached yet), rebased, frozen or skipped. `VisitAccounts` counts them and their history
tokens (a skipped visit counts what it would have sent at the limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from hstu_replay.errors import ConfigError
from hstu_replay.interface import history_tokens


class OverLimit(StrEnum):
    SKIP = "skip"
    OLDEST = "oldest"
    REBASE = "rebase"


DEFAULT_OVER_LIMIT = OverLimit.SKIP
DEFAULT_REBASE_KEEP = 0.5

#: the kinds of visit, by their code in a trace's `kind` column
KINDS = ("warm", "cold", "rebased", "frozen", "skipped")
WARM, COLD, REBASED, FROZEN, SKIPPED = range(len(KINDS))


@dataclass(frozen=True)
class HistoryPolicy:
    """`--over-limit` and `--rebase-keep`, checked."""

    over_limit: OverLimit = DEFAULT_OVER_LIMIT
    rebase_keep: float = DEFAULT_REBASE_KEEP  # fraction of the limit a rebase keeps, in (0, 1]

    @classmethod
    def of(cls, over_limit: str, rebase_keep: float) -> HistoryPolicy:
        try:
            policy = OverLimit(over_limit)
        except ValueError:
            raise ConfigError(f"--over-limit {over_limit!r}: use {', '.join(p.value for p in OverLimit)}") from None
        if not 0.0 < rebase_keep <= 1.0:
            raise ConfigError(f"--rebase-keep {rebase_keep}: a fraction of the limit in (0, 1], e.g. 0.5")
        return cls(policy, rebase_keep)

    def kept(self, cap: int) -> int:
        """Items a rebase keeps: the latest `rebase_keep` of the limit, at least one."""
        return max(1, min(cap, int(self.rebase_keep * cap)))

    def plan_user(self, starts: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For one user's visits (`starts`: each visit's first event, ascending; the events before
        it are its history): (first history item, items sent, kind, key epoch) of each. A new
        epoch means a fresh cache key; a skipped visit sends nothing."""
        n = len(starts)
        first, length = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        kind, epoch = np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.int64)
        base, era = 0, 0
        for i, s in enumerate(int(x) for x in starts):
            if s - base <= cap:
                kind[i] = COLD if i == 0 else WARM
            elif self.over_limit is OverLimit.SKIP:
                kind[i:] = SKIPPED
                break
            elif self.over_limit is OverLimit.OLDEST:
                kind[i], length[i], epoch[i] = FROZEN, cap, era
                continue
            else:
                base, era = s - self.kept(cap), era + 1
                kind[i] = REBASED
            first[i], length[i], epoch[i] = base, s - base, era
        return first, length, kind, epoch


@dataclass(frozen=True)
class VisitAccounts:
    """Visits and history tokens of each kind; they add up across shards and workers."""

    visits: tuple[int, ...] = (0,) * len(KINDS)
    tokens: tuple[int, ...] = (0,) * len(KINDS)

    @classmethod
    def of(cls, kinds: np.ndarray, tokens: np.ndarray, skipped: int, cap: int) -> VisitAccounts:
        kinds = np.asarray(kinds, dtype=np.int64)
        visits = np.bincount(kinds, minlength=len(KINDS)).astype(np.int64)
        sums = np.bincount(kinds, weights=np.asarray(tokens, dtype=np.float64), minlength=len(KINDS))
        visits[SKIPPED] += skipped
        sums[SKIPPED] += skipped * history_tokens(cap)
        return cls(tuple(int(v) for v in visits), tuple(int(round(t)) for t in sums))

    def __add__(self, other: VisitAccounts) -> VisitAccounts:
        return VisitAccounts(tuple(a + b for a, b in zip(self.visits, other.visits)),
                             tuple(a + b for a, b in zip(self.tokens, other.tokens)))

    def to_dict(self, policy: HistoryPolicy) -> dict:
        """What the reports show: the policy, then each kind's visits and tokens with their shares."""
        all_visits, all_tokens = sum(self.visits), sum(self.tokens)
        return {
            "over_limit": policy.over_limit.value,
            "rebase_keep": policy.rebase_keep if policy.over_limit is OverLimit.REBASE else None,
            "visits": all_visits, "tokens": all_tokens,
            "kinds": {k: {"visits": v, "tokens": t, "visit_share": v / all_visits if all_visits else None,
                          "token_share": t / all_tokens if all_tokens else None}
                      for k, v, t in zip(KINDS, self.visits, self.tokens)},
            "note": "skipped visits are not sent; their tokens are what they would have sent at the limit",
        }


def accounts_line(section: dict) -> str:
    """One line for a terminal: the policy and each kind's visits and token share."""
    parts = [f"{k} {v['visits']:,} ({_pct(v['token_share'])} of tokens)" for k, v in section["kinds"].items()]
    return f"over the limit: {section['over_limit']}; {section['visits']:,} visits: " + ", ".join(parts)


def accounts_rows(section: dict) -> list[list[str]]:
    """Rows (kind, visits, visit share, tokens, token share) for a table."""
    return [[k, f"{v['visits']:,}", _pct(v["visit_share"]), f"{v['tokens']:,}", _pct(v["token_share"])]
            for k, v in section["kinds"].items()]


ACCOUNTS_HEADER = ["visit", "visits", "share", "history tokens", "token share"]


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{100 * share:.1f}%"
