"""A 'KV-cache hit ratio' tab in Locust's web UI: the latency-vs-hit-ratio charts and the stage
table, live while the run goes, and the live HTML report one click away.

Locust's extended tab is a table fed by `extended_stats` in /stats/requests; the charts are the
report's SVG charts (report/charts.py), fetched from /hstu/charts and placed above that table by a small
script (webui_tab.js) added to Locust's page, with the tier and fleet sections of the HTML report. Rows and charts come from one report object: the
report written at the end of the run (report.json) once it ended, the live one before.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from flask import Response, request

from hstu_replay.report.html import fleet_html, source_label, tiers_section
from hstu_replay.output.page import escape
from hstu_replay.report.summary import goal_name
from hstu_replay.report.tier_section import shows_tiers, tier_columns
from hstu_replay.report.worker_events import loss_lines

TAB_KEY = "hstu-hit-ratio"
TAB_TITLE = "KV-cache hit ratio"
TAB_SCRIPT = Path(__file__).with_name("webui_tab.js")
COLUMNS = [("bin", "Stage"), ("batch", "Batch"), ("target", "Target hit ratio"), ("achieved", "Achieved hit ratio"),
           ("source", "Achieved from"), ("requests", "Requests"), ("primes", "Primes"), ("rps", "Req/s"),
           ("server_rps", "Server req/s"), ("mean", "Mean ms"), ("p50", "p50 ms"), ("p99", "p99 ms"),
           ("speedup", "Speed-up"), ("errors", "Errors"), ("mismatches", "Mismatches"), ("flags", "Flags")]


def tab_report(environment) -> dict | None:
    """The report the tab shows: the one written at the end (report.json), else the live one."""
    from hstu_replay.loadtest.finish import current_report

    run = getattr(getattr(environment, "hstu", None), "run", None)
    if run is None:
        return None
    return run.figures.report if run.live.ended and run.figures.report is not None else current_report(environment)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "" if x is None else format(x, spec)


def rows(report: dict) -> list[dict]:
    """One row per stage: its bin's figures beside its target, provenance and flags; where the run has
    tiers to speak of (as the HTML report's tier section), the stage's tier columns too."""
    reasons = {s["name"]: "; ".join(f"{f['flag']}: {f['reason']}" for f in s["flags"]) for s in report["stages"]}
    tiers = {s["name"]: _tier_cells(s) for s in report["stages"]} if shows_tiers(report) else {}
    return [{"bin": b["name"], "safe_name": b["name"], "batch": b["batch_size"], "target": goal_name(b["target_ratio"]),
             "achieved": _fmt(b["achieved_ratio"], ".3f"), "source": source_label(b["hit_source"]),
             "requests": b["requests"], "primes": b["prime_requests"], "rps": _fmt(b["throughput_rps"], ".1f"),
             "server_rps": _fmt(b["server_rps"], ".1f"), "mean": _fmt(b["mean_ms"]), "p50": _fmt(b["p50_ms"]),
             "p99": _fmt(b["p99_ms"]), "speedup": _fmt(b["speedup"]), "errors": b["errors"],
             "mismatches": b["mismatches"],
             "flags": reasons.get(b["name"]) or "ok"} | tiers.get(b["name"], {})
            for b in report["bins"]]


def _tier_cells(stage: dict) -> dict[str, str]:
    """A stage's `tier_columns` as the tab shows them: figures to three decimals, empty where unknown."""
    def cell(value: object) -> str:
        if isinstance(value, float):
            return format(value, ".3f") if math.isfinite(value) else ""
        return "" if value is None else str(value)

    return {k: cell(v) for k, v in tier_columns(stage).items()}


def charts_fragment(report: dict | None) -> str:
    from hstu_replay.report.charts import charts

    if report is None:
        return "<p>No run yet.</p>"
    workers = "".join(f'<p style="margin:4px 0;color:#c60">{escape(line)}</p>' for line in loss_lines(report))
    return (workers + '<div style="display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start">'
            + "".join(charts(report))
            + "</div>" + "".join(tiers_section(report)) + "".join(fleet_html(report))
            + '<p style="margin:4px 0 12px">'
            '<a style="color:inherit" href="/hstu/report.html" target="_blank" rel="noopener">Full report (HTML)</a>'
            ' &middot; <a style="color:inherit" href="/hstu/report.json" target="_blank" rel="noopener">report.json</a>'
            "</p>")


def install(environment) -> None:
    web_ui = environment.web_ui
    login = web_ui.auth_required_if_enabled
    web_ui.template_args.update(
        extended_tabs=[{"title": TAB_TITLE, "key": TAB_KEY}],
        extended_tables=[{"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in COLUMNS]}],
        extended_csv_files=[{"href": "/hstu/report.html", "title": "Live hit-ratio report (HTML, with charts)"}],
    )

    @web_ui.app.after_request
    def extend_locust_pages(response):
        if request.endpoint == "locust.index" and response.status_code == 200 and response.mimetype == "text/html":
            page = response.get_data(as_text=True)
            response.set_data(page.replace("</body>", '<script src="/hstu/tab.js"></script></body>', 1))
        elif request.endpoint == "locust.request_stats":
            report = tab_report(environment)
            body = response.get_json(silent=True)
            if report is not None and body is not None:
                body["extended_stats"] = [{"key": TAB_KEY, "data": rows(report)}]
                response.set_data(json.dumps(body))
        return response

    @web_ui.app.route("/hstu/tab.js")
    @login
    def tab_script():
        return Response(TAB_SCRIPT.read_text(), mimetype="text/javascript")

    @web_ui.app.route("/hstu/charts")
    @login
    def tab_charts():
        return Response(charts_fragment(tab_report(environment)), mimetype="text/html")

    @web_ui.app.route("/hstu/report.json")
    @login
    def live_report_json():
        report = tab_report(environment)
        return Response(json.dumps(report), status=200 if report is not None else 404, mimetype="application/json")

    @web_ui.app.route("/hstu/report.html")
    @login
    def live_report():
        from hstu_replay.report.html import render_html

        report = tab_report(environment)
        if report is None:
            return Response("<p>No run yet.</p>", mimetype="text/html")
        return Response(render_html(report), mimetype="text/html")
