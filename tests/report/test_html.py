"""The HTML report reads like a report: UTC dates, charts, flags explained, an options table."""

import re

import pytest

from hstu_replay.report.flags import FLAG_MEANINGS
from hstu_replay.report.html import duration, render_html, utc_time

SECRET = "Bearer s3cr3t-sentinel"


def _stage(name, batch, target, flags=()):
    return {"name": name, "batch_size": batch, "target_ratio": target, "expected_ratio": target,
            "predicted_ratio": target, "observed_ratio": None, "achieved_ratio": target, "hit_source": "predicted",
            "hit_disagreements": 0, "requests": 12, "mean_ms": 4.0, "ms_per_logical_request": 4.0,
            "p50_ci_ms": [1.0, 2.0], "p99_ci_ms": [3.0, None],
            "client_cpu_peak": 0.25, "loop_lag_p99_ms": 1.5,
            "flags": [{"flag": f, "reason": r} for f, r in flags]}


def _bin(name, batch, target, p50, speedup):
    return {"name": name, "batch_size": batch, "target_ratio": target, "achieved_ratio": target,
            "hit_source": "predicted", "requests": 12, "errors": 0, "mismatches": 0, "prime_requests": 0,
            "throughput_rps": 6.0,
            "server_rps": 6.0, "mean_ms": p50, "ms_per_logical_request": p50, "p50_ms": p50, "p90_ms": p50,
            "p99_ms": p50 * 2, "p999_ms": p50 * 2, "speedup": speedup, "flags": [], "server": None}


@pytest.fixture
def report() -> dict:
    """A run of 2 min 5 s whose two stages are thin, one also off target."""
    return {
        "tool": "hstu-replay", "version": "0.1.0", "created": "2024-05-01T12:02:05+00:00",
        "run": {"model": "hstu_gr_ranking_kvcache", "caches": True, "reports_hits": False,
                "url": "127.0.0.1:8001", "started": 1714564800.25, "history_caps": {"8": 2481},
                "server_limits": {"published": {"max_batch": 8, "max_values": 4656, "max_candidates": 32,
                                                "max_history": 256},
                                  "caps": [{"option": "--max-history", "asked": 4096, "used": 256}]},
                "options": {"triton_url": "127.0.0.1:8001", "triton_headers": f"authorization={SECRET}",
                            "access_token": SECRET, "cache_page_tokens": 32, "store": "", "triton_ssl": False,
                            "stage_seconds": 2.0, "tolerance": 0.0625}},
        "stages": [_stage("b1_h0.00", 1, 0.0, [("thin", "12 measured requests < 30")]),
                   _stage("b1_h1.00", 1, 1.0, [("thin", "12 measured requests < 30"),
                                               ("off-target", "achieved 0.9 is 0.1 from its target 1")])],
        "bins": [_bin("b1_h0.00", 1, 0.0, 10.0, 1.0), _bin("b1_h1.00", 1, 1.0, 4.0, 2.5)],
        "verification": {"verified": 24, "mismatches": 0, "tolerance": 0.0625},
        "primes": {"requests": 0, "failures": 0}, "warmup_requests": 3, "errors": {}, "error_examples": {},
        "thresholds": None,
    }


def _text(page: str) -> str:
    """The page as a reader sees it: tags dropped, cells apart."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page))


@pytest.mark.parametrize("value, shown", [
    (0, "1970-01-01 00:00:00 UTC"),
    (1714564800.25, "2024-05-01 12:00:00 UTC"),
    ("2024-05-01T12:30:00+02:00", "2024-05-01 10:30:00 UTC"),
    ("2024-05-01T12:30:00", "2024-05-01 12:30:00 UTC"),  # no zone: taken as UTC
    (None, "-"),
])
def test_utc_time(value, shown):
    assert utc_time(value) == shown


@pytest.mark.parametrize("seconds, shown", [(0.4, "0 s"), (45, "45 s"), (125, "2 min 5 s"), (3780, "1 h 3 min")])
def test_duration(seconds, shown):
    assert duration(seconds) == shown


def test_dates_are_human_and_utc(report):
    text = _text(render_html(report))
    assert "started 2024-05-01 12:00:00 UTC" in text
    assert "report written 2024-05-01 12:02:05 UTC (2 min 5 s after the start)" in text
    assert "1714564800" not in text and "2024-05-01T12:02:05" not in text


def test_options_are_a_table_and_secrets_never_shown(report):
    page = render_html(report)
    assert "s3cr3t" not in page
    assert '{"' not in page  # no JSON blob
    text = _text(page)
    for row in ("triton_headers (hidden)", "access_token (hidden)", "cache_page_tokens 32", "store (not set)",
                "triton_ssl no", "stage_seconds 2 ", "tolerance 0.0625"):
        assert row in text, row


def test_run_reads_in_words(report):
    text = _text(render_html(report))
    for row in ("model keeps a KV cache yes", "server reports its cache hits no",
                "history caps batch 8: 2,481 items", "started 2024-05-01 12:00:00 UTC",
                "server limits batch 8, 4,656 values, 32 candidates, 256 history items; --max-history 4,096 capped "
                "to 256"):
        assert row in text, row


def test_a_server_that_publishes_no_limits_reads_so(report):
    report["run"]["server_limits"] = None
    assert "server limits none published" in _text(render_html(report))


def test_flags_explained_per_stage(report):
    text = _text(render_html(report))
    assert f"thin (b1_h0.00, b1_h1.00) {FLAG_MEANINGS['thin']}" in text
    assert f"off-target (b1_h1.00) {FLAG_MEANINGS['off-target']}" in text
    assert "thin: 12 measured requests &lt; 30; off-target: achieved 0.9 is 0.1 from its target 1" in text


def test_a_flag_without_a_meaning_points_to_its_reason(report):
    report["stages"][0]["flags"] = [{"flag": "new-kind", "reason": "why"}]
    report["stages"][1]["flags"] = []
    text = _text(render_html(report))
    assert "new-kind (b1_h0.00) see the reasons in the stage table" in text


def test_solid_stages_are_said_to_be(report):
    for stage in report["stages"]:
        stage["flags"] = []
    assert "No stage is flagged" in render_html(report)


def test_charts_inline_before_the_tables(report):
    page = render_html(report)
    latency, speedup, stages = (page.index('data-chart="latency"'), page.index('data-chart="speedup"'),
                                page.index("Stages: target vs achieved"))
    assert latency < speedup < stages
    assert page.count('class="point"') == 2 * 2 + 2  # p50 and p99 per stage, then speed-ups
    assert "client cache model (predicted)" in page


def test_failures_read_by_stage_and_by_cause_in_full(report):
    # stage b1_h1.00: 163 of 175 requests sent got no answer, of one cause; one of its 12 answers was wrong
    cause = "INVALID_ARGUMENT: user <id>: history of <n> items exceeds <n>"
    mismatch = "mismatch in batch_<n> user <id>; ...: user <id> max |diff| <n> > <n>"
    report["bins"][1].update(errors=163, mismatches=1)
    report["stages"][1]["flags"] = [{"flag": "errors", "reason": "163 of 175 measured requests failed"},
                                    {"flag": "mismatches", "reason": "1 of 12 verified answers differ from their reference"}]
    report["errors"] = {cause: 163, mismatch: 1}
    report["error_examples"] = {cause: "INVALID_ARGUMENT: user 4417: history of 5120 items exceeds 4096",
                                mismatch: "mismatch in batch_000002 user 3; batch_000002 user 4: user 1234 max |diff| "
                                          "1 > 0.0625"}
    text = _text(render_html(report))
    assert "errors mismatches primes" in text  # the latency table's columns beside requests
    assert "1 1 1.000 model 12 163 1 0 " in text  # batch, target, achieved, from, requests, errors, mismatches, primes
    assert f"errors (b1_h1.00) {FLAG_MEANINGS['errors']}" in text
    assert "164 failures of 2 causes" in text
    assert ("163 &times; INVALID_ARGUMENT: user &lt;id&gt;: history of &lt;n&gt; items exceeds &lt;n&gt; "
            "e.g. INVALID_ARGUMENT: user 4417: history of 5120 items exceeds 4096") in text
    assert "1 &times; mismatch in batch_&lt;n&gt; user &lt;id&gt;; ...: user" in text


def test_a_passing_verdict_names_the_thresholds_met(report):
    report["thresholds"] = {"passed": True, "violations": [], "checked": ["p99 <= 250 ms", "mismatches <= 0"]}
    text = _text(render_html(report))
    assert "Thresholds: PASSED met: p99 &lt;= 250 ms met: mismatches &lt;= 0" in text
