"""A 'KV-cache hit ratio' tab in Locust's web UI: the live latency-vs-hit-ratio table, and the
live HTML report (with its charts) one click away."""

from __future__ import annotations

import json

from flask import Response, request

from hstu_replay.report.html import SOURCE_LABEL

TAB_KEY = "hstu-hit-ratio"
COLUMNS = [("bin", "Stage"), ("achieved", "Achieved hit ratio"), ("source", "Achieved from"),
           ("requests", "Requests"), ("primes", "Primes"), ("rps", "Req/s"), ("server_rps", "Server req/s"),
           ("mean", "Mean ms"), ("p50", "p50 ms"), ("p99", "p99 ms"), ("speedup", "Speed-up"),
           ("mismatches", "Mismatches"), ("flags", "Flags")]


def _rows(environment) -> list[dict]:
    from hstu_replay.loadtest.finish import current_report

    rows = []
    for b in current_report(environment)["bins"]:
        def fmt(x, spec=".2f"):
            return "" if x is None else format(x, spec)

        rows.append({"bin": b["name"], "safe_name": b["name"], "achieved": fmt(b["achieved_ratio"], ".3f"),
                     "source": SOURCE_LABEL[b["hit_source"]], "requests": b["requests"],
                     "primes": b["prime_requests"], "rps": fmt(b["throughput_rps"], ".1f"),
                     "server_rps": fmt(b["server_rps"], ".1f"), "mean": fmt(b["mean_ms"]),
                     "p50": fmt(b["p50_ms"]), "p99": fmt(b["p99_ms"]), "speedup": fmt(b["speedup"]),
                     "mismatches": b["mismatches"], "flags": ", ".join(b["flags"]) or "ok"})
    return rows


def install(environment) -> None:
    web_ui = environment.web_ui
    web_ui.template_args.update(
        extended_tabs=[{"title": "KV-cache hit ratio", "key": TAB_KEY}],
        extended_tables=[{"key": TAB_KEY, "structure": [{"key": k, "title": t} for k, t in COLUMNS]}],
        extended_csv_files=[{"href": "/hstu/report.html", "title": "Live hit-ratio report (HTML, with charts)"}],
    )

    @web_ui.app.after_request
    def add_hit_ratio_table(response):
        if request.path != "/stats/requests" or getattr(getattr(environment, "hstu", None), "run", None) is None:
            return response
        body = response.get_json(silent=True) or {}
        body["extended_stats"] = [{"key": TAB_KEY, "data": _rows(environment)}]
        response.set_data(json.dumps(body))
        return response

    @web_ui.app.route("/hstu/report.html")
    def live_report():
        from hstu_replay.loadtest.finish import current_report
        from hstu_replay.report.html import render_html
        from hstu_replay.report.plots import available, render_plots

        if environment.hstu.run is None:
            return Response("<p>No run yet.</p>", mimetype="text/html")
        report = current_report(environment)
        return Response(render_html(report, render_plots(report) if available() else {}), mimetype="text/html")
