"""A natural replay's report section: every visit of the requests sent, by kind, from their labels."""

from __future__ import annotations

import pytest

from hstu_replay.plan.over_limit import HistoryPolicy, OverLimit
from hstu_replay.report.natural import natural_html, natural_section


def _record(t: float, kind: str, label: str, tokens: int, ok: bool = True) -> dict:
    return {"t": t, "kind": kind, "latency_ms": 2.0, "tokens": tokens, "observed_hits": 0, "predicted_hits": 0,
            "ok": ok, "label": label}


def test_the_section_counts_every_visit_of_the_requests_sent():
    records = [
        _record(1.0, "warmup", "user 7 visit at 10 ms items 2 cold", 10),
        _record(2.0, "measure", "user 7 visit at 90 ms items 3 warm; user 8 visit at 90 ms items 1 cold", 20),
        _record(3.0, "measure", "user 8 visit at 200 ms items 4 rebased; skipped 2 visits 28 tokens", 14),
        _record(4.0, "measure", "user 7 visit at 300 ms items 5 warm", 16, ok=False),  # sent, not answered
    ]
    section = natural_section(records, HistoryPolicy(OverLimit.REBASE, 0.25))
    kinds = section["visit_kinds"]
    # cold 10 + 8 tokens; warm 12 + 16; rebased 14; skipped 28: 88 tokens over 7 visits
    assert kinds["over_limit"] == "rebase" and kinds["rebase_keep"] == 0.25
    assert kinds["visits"] == 7 and kinds["tokens"] == 88
    assert {k: (v["visits"], v["tokens"]) for k, v in kinds["kinds"].items()} == {
        "warm": (2, 28), "cold": (2, 18), "rebased": (1, 14), "frozen": (0, 0), "skipped": (2, 28)}
    assert kinds["kinds"]["skipped"]["token_share"] == pytest.approx(28 / 88)
    assert section["measured_visit_kinds"]["visits"] == 6  # the warm-up's cold visit left out
    assert section["requests"] == 2  # answered measured requests, as before
    assert section["failed"] == {"requests": 1, "keys_replaced": 1, "visits": [[7, 300]]}  # user 7 goes on afresh
    page = "".join(natural_html(section))
    assert "--over-limit rebase" in page and "rebased" in page and "31.8%" in page
    assert "1 requests failed; 1 keys replaced" in page
