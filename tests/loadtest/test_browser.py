"""Locust's web UI in a real browser: Debian's chromium driven by Playwright starts a run from the
form against the built-in target; the "KV-cache hit ratio" tab shows its rows and charts while the
run goes, and at the end they hold exactly what report.json holds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_ports, locust_command, wait_until

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright's own browser download is not used
TAB = "KV-cache hit ratio"
SOURCES = {"observed": "server-reported (observed)", "predicted": "client cache model (predicted)"}
CHART_KEYS = {"latency": ("p50_ms", "p99_ms"), "speedup": ("speedup",)}


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _fixed(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def expected_rows(report: dict) -> dict[str, list[str]]:
    """Stage name -> the tab's cells, from report.json as the tab's columns describe them."""
    flags = {s["name"]: "; ".join(f"{f['flag']}: {f['reason']}" for f in s["flags"]) or "ok" for s in report["stages"]}
    return {b["name"]: [b["name"], str(b["batch_size"]), f"{b['target_ratio']:g}", _fixed(b["achieved_ratio"], 3),
                        SOURCES[b["hit_source"]], str(b["requests"]), str(b["prime_requests"]),
                        _fixed(b["throughput_rps"], 1), _fixed(b["server_rps"], 1), _fixed(b["mean_ms"], 2),
                        _fixed(b["p50_ms"], 2), _fixed(b["p99_ms"], 2), _fixed(b["speedup"], 2),
                        str(b["errors"]), str(b["mismatches"]), flags[b["name"]]]
            for b in report["bins"]}


def expected_points(report: dict) -> dict[tuple[str, str, str], tuple[float, float, str]]:
    """(chart, stage, statistic) -> (achieved ratio, value, flags) for every figure report.json has."""
    return {(chart, b["name"], key): (b["achieved_ratio"], b[key], ",".join(b["flags"]))
            for chart, keys in CHART_KEYS.items() for key in keys for b in report["bins"]
            if b["achieved_ratio"] is not None and b[key] is not None}


def shown_rows(page) -> dict[str, list[str]]:
    rows = page.locator("table").filter(has_text="Achieved from").locator("tbody tr")
    cells = [[c.strip() for c in row.locator("td").all_inner_texts()] for row in rows.all()]
    return {row[0]: row for row in cells if row}


def shown_points(page) -> dict[tuple[str, str, str], tuple[float, float, str]]:
    return {(c["chart"], c["stage"], c["metric"]): (float(c["x"]), float(c["y"]), c["flags"])
            for c in page.eval_on_selector_all(
                "#hstu-charts svg.hstu-chart circle.point",
                "els => els.map(e => ({chart: e.closest('svg').dataset.chart, stage: e.dataset.stage, "
                "metric: e.dataset.metric, x: e.dataset.x, y: e.dataset.y, flags: e.dataset.flags}))")}


def test_a_run_from_the_form_draws_its_curve_and_stages(triton_server, reference_dumps, tmp_path):
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: bash scripts/setup.sh (the test extra)")
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: bash scripts/setup.sh installs Debian's chromium"

    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    report_dir = tmp_path / "report"
    log = (tmp_path / "locust.log").open("w")
    # the options on the command line pre-fill the form; only users and spawn rate are typed in
    process = subprocess.Popen(
        locust_command("--web-host", "127.0.0.1", "--web-port", str(port), "--loglevel", "WARNING",
                       "--triton-url", triton_server.grpc_url, "--workload", "dumps",
                       "--dump-dir", str(reference_dumps), "--hit-ratios", "0,1.0", "--batch-sizes", "1,2",
                       "--stage-seconds", "3", "--warmup-seconds", "0.5", "--max-history", "256",
                       "--report-dir", str(report_dir),
                       "--min-stage-requests", "1000000"),  # every stage thin: flags shown in rows and charts
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    screenshot = tmp_path / "web-ui-hit-ratio-tab.png"
    try:
        wait_until(lambda: _get(f"{base}/stats/requests")["state"] == "ready", 60, "the web UI")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                script_errors: list[str] = []
                page.on("pageerror", lambda error: script_errors.append(str(error)))
                page.goto(base)
                page.get_by_label("Number of users (peak concurrency)").fill("2")
                page.get_by_label("Ramp up (users started/second)").fill("2")
                page.get_by_role("button", name="Start").click()
                page.get_by_role("tab", name=TAB).click()

                # live: rows and chart points appear while the run goes
                expect(page.locator("table").filter(has_text="Achieved from").locator("tbody tr").first
                       ).to_be_visible(timeout=60_000)
                expect(page.locator("#hstu-charts svg[data-chart='latency'] circle.point").first
                       ).to_be_visible(timeout=30_000)
                state = _get(f"{base}/stats/requests")["state"]
                assert state in ("spawning", "running"), f"the charts appeared only once the run was {state}"

                wait_until(lambda: _get(f"{base}/stats/requests")["state"] == "stopped", 120, "the sweep to end")
                wait_until(lambda: (report_dir / "report.json").is_file(), 15, "report.json")
                report = json.loads((report_dir / "report.json").read_text())
                rows, points = expected_rows(report), expected_points(report)
                assert sorted(rows) == ["b1_h0.00", "b1_h1.00", "b2_h0.00", "b2_h1.00"]
                assert report["run"]["users"] == 2  # as typed in the form, also after the users stopped
                assert len(points) == 4 * 3  # p50, p99 and speed-up of every stage
                assert all("thin" in [f["flag"] for f in stage["flags"]] for stage in report["stages"])
                expect(page.locator("header")).to_contain_text("stopped", ignore_case=True, timeout=15_000)
                deadline = time.monotonic() + 20  # both poll every 2 s: a few rounds to show the final report
                while (shown_rows(page), shown_points(page)) != (rows, points) and time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                page.screenshot(path=str(screenshot), full_page=True)
                print(f"screenshot of the tab: {screenshot}")
                assert shown_rows(page) == rows
                assert shown_points(page) == points
                assert script_errors == []
                page.goto(f"{base}/hstu/report.html")  # the full report, a click away
                expect(page.locator("svg[data-chart='speedup']")).to_be_visible()
                # every table of the report whole at 1,400 px: none scrolls sideways
                scrolling = page.eval_on_selector_all(
                    ".table", "els => els.filter(e => e.scrollWidth > e.clientWidth)"
                              ".map(e => e.querySelector('th').textContent + ': ' + e.scrollWidth + ' > ' + e.clientWidth)")
                assert scrolling == [], scrolling
            finally:
                browser.close()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        log.close()
    assert screenshot.stat().st_size > 10_000
