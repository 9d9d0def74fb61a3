"""The run's HTML report on a laptop screen: Debian's chromium driven by Playwright renders
report.html at 1,400 px, where the page is no wider than the window and every table shows whole
(none scrolls); in a narrower window (900 px) the stages table, wider than its box, scrolls inside
it with the stage names kept in view."""

from __future__ import annotations

from pathlib import Path

import pytest

from hstu_replay.report.summary import build_report
from hstu_replay.report.writers import write_reports
from hstu_replay.stats.histogram import LatencyHistogram
from hstu_replay.stats.run_stats import BinKey, BinStats, RunStats

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright's own browser download is not used
LAPTOP = {"width": 1400, "height": 900}
NARROW = {"width": 900, "height": 900}
STAGES_BOX = "h2:has-text('Stages') + div.table"


def _report() -> dict:
    """Six thin stages (flagged, so the flags column has its reasons) of two batch sizes."""
    stats = RunStats()
    for batch in (1, 8):
        for ratio in (0.0, 0.5, 1.0):
            ms = [2.0 + i * 0.1 for i in range(12)]
            stats.bins[BinKey(batch, ratio)] = BinStats(
                latency=LatencyHistogram.of(m / 1e3 for m in ms), requests=len(ms), first_start=0.0,
                last_end=2.0, history_tokens=1000, predicted_hits=int(1000 * ratio), verified=len(ms))
    return build_report(stats, {"model": "hstu_gr_ranking_kvcache", "url": "127.0.0.1:8001", "users": 4})


def test_the_run_report_fits_a_laptop_screen(tmp_path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: bash scripts/setup.sh (the test extra)")
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: bash scripts/setup.sh installs Debian's chromium"
    report = _report()
    assert all(stage["flags"] for stage in report["stages"])
    html = write_reports(report, tmp_path, formats=["html"])["html"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.goto(html.as_uri())
            width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
            assert width[0] <= width[1], f"the page is {width[0]} px wide in a window of {width[1]} px"
            scrolling = page.eval_on_selector_all(".table", "els => els.filter(e => e.scrollWidth > e.clientWidth)"
                                                            ".map(e => (e.previousElementSibling || e).textContent.slice(0, 60))")
            assert scrolling == [], f"tables wider than the window at 1,400 px: {scrolling}"
            page = browser.new_page(viewport=NARROW)
            page.goto(html.as_uri())
            box = page.locator(STAGES_BOX)
            inner, shown = box.evaluate("e => [e.scrollWidth, e.clientWidth]")
            assert inner > shown, "the stages table fits: nothing here to scroll"
            first, last = box.locator("tbody tr").first.locator("td").first, box.locator("tbody tr td").last
            before = (first.bounding_box()["x"], last.bounding_box()["x"])
            box.evaluate("e => { e.scrollLeft = e.scrollWidth; }")
            after = (first.bounding_box()["x"], last.bounding_box()["x"])
            assert after[0] == pytest.approx(before[0], abs=1), "the stage names scrolled out of view"
            assert after[1] < before[1] - (inner - shown) / 2, "the table did not scroll inside its box"
            assert first.inner_text() == report["stages"][0]["name"]
        finally:
            browser.close()
