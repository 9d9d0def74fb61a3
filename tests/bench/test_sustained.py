"""bench.sustained's arithmetic: stretches and verdicts from hand-made samples (no run, no timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sustained import Books, Sample, books, judge, stretch

ROOT = Path(__file__).resolve().parents[2]


def steady(minutes: int, rss: float = 100.0, cpu_ms: float = 2.0, rps: float = 5.0) -> list[Sample]:
    """A sample every 30 s of a worker at `rps` spending `cpu_ms` per request with `rss` MiB."""
    return [Sample(30.0 * i, rss, 30 * i * rps * cpu_ms / 1e3, int(30 * i * rps), 1.0) for i in range(2 * minutes + 1)]


def test_a_stretch_sums_from_its_first_to_its_last_sample():
    s = stretch([Sample(0, 100, 1.0, 10, 2.0), Sample(30, 110, 1.3, 160, 1.0), Sample(60, 120, 1.6, 310, 3.0)])
    assert (s.start_s, s.end_s, s.requests) == (0, 60, 300)
    assert s.rss_mib == pytest.approx(110)  # (100 + 110 + 120) / 3
    assert s.cpu_ms == pytest.approx(2.0)  # 0.6 s over 300 requests
    assert s.rps == pytest.approx(5.0)
    assert s.load1 == pytest.approx(2.0)
    with pytest.raises(ValueError):
        stretch([Sample(0, 1, 1, 1)])


def test_a_steady_hour_is_flat_and_constant():
    v = judge(steady(60), 600)
    assert (v.first.start_s, v.first.end_s, v.last.start_s, v.last.end_s) == (0, 600, 3000, 3600)
    assert v.first.requests == v.last.requests == 3000
    assert v.rss_change == pytest.approx(0) and v.cpu_change == pytest.approx(0)
    assert v.rss_flat and v.cpu_constant


def test_memory_growing_past_the_tolerance_is_not_flat():
    # RSS grows 0.5 MiB per sample from 100 MiB: the first ten minutes (samples 0..20) average 105,
    # the last (samples 100..120) 155: +47.6%
    samples = [Sample(s.t_s, 100 + 0.5 * i, s.cpu_s, s.requests) for i, s in enumerate(steady(60))]
    v = judge(samples, 600)
    assert v.first.rss_mib == pytest.approx(105) and v.last.rss_mib == pytest.approx(155)
    assert v.rss_change == pytest.approx(155 / 105 - 1)
    assert not v.rss_flat and v.cpu_constant


def test_growth_within_the_tolerance_is_flat():
    # +9 MiB over the run from 100: the first window's samples 0..20 average 100 + 9 x 10/120 = 100.75,
    # the last's 100..120 average 100 + 9 x 110/120 = 108.25 (+7.4%)
    samples = [Sample(s.t_s, 100 + 9 * i / 120, s.cpu_s, s.requests) for i, s in enumerate(steady(60))]
    v = judge(samples, 600)
    assert v.first.rss_mib == pytest.approx(100.75) and v.last.rss_mib == pytest.approx(108.25)
    assert v.rss_flat


def test_cpu_per_request_rising_is_caught():
    # the last ten minutes cost 2.3 ms per request instead of 2.0: +15%
    samples = steady(60)
    late = [s if s.t_s <= 3000 else Sample(s.t_s, s.rss_mib, samples[100].cpu_s + (s.requests - samples[100].requests)
                                          * 2.3e-3, s.requests) for s in samples]
    v = judge(late, 600)
    assert v.first.cpu_ms == pytest.approx(2.0) and v.last.cpu_ms == pytest.approx(2.3)
    assert v.cpu_change == pytest.approx(0.15)
    assert not v.cpu_constant and v.rss_flat
    assert judge(late, 600, tolerance=0.2).cpu_constant


def test_a_run_shorter_than_two_windows_is_refused():
    with pytest.raises(ValueError, match="two windows"):
        judge(steady(15), 600)


def test_books_agree_only_when_report_records_and_server_agree(tmp_path):
    report = {"bins": [{"requests": 3, "prime_requests": 1}], "warmup_requests": 1}
    (tmp_path / "report.json").write_text(json.dumps(report))
    kinds = ["warmup", "prime", "measure", "measure", "measure", "measure"]
    oks = [True, True, True, True, True, False]  # a failed request is not counted as sent
    (tmp_path / "records-local-h-1.jsonl").write_text(
        "".join(json.dumps({"kind": k, "ok": ok}) + "\n" for k, ok in zip(kinds, oks)))
    assert books(tmp_path, 5) == Books(3, 3, 5, 5, 5)
    assert books(tmp_path, 5).consistent
    assert not books(tmp_path, 6).consistent  # the server answered one the records do not hold
    assert not Books(3, 2, 5, 5, 5).consistent


def test_samples_a_little_late_still_give_windows_of_equal_length():
    # a sample every 10.05 s instead of 10 s: a 30 s window is three intervals at both ends
    samples = [Sample(10.05 * i, 100.0, 0.02 * i, 10 * i) for i in range(12)]
    v = judge(samples, 30)
    assert (v.first.start_s, v.last.start_s) == (0, pytest.approx(10.05 * 8))
    assert v.first.requests == v.last.requests == 30


@pytest.mark.parametrize("bad", [["--minutes", "15"], ["--every", "0"], ["--every", "301"], ["--rate", "0"],
                                 ["--users", "0"], ["--window-minutes", "0"]])
def test_bad_options_exit_2_with_one_line_before_any_load(bad):
    done = subprocess.run([sys.executable, "-m", "bench.sustained", *bad], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith("sustained:"), bad
