"""One self-contained HTML page of a report: inline CSS and SVG charts, no scripts or links.

It reads as a report: when the run started and the report was written (UTC), the verdict, the
latency-vs-hit-ratio charts and table, the stages with their flags explained, verification,
the server's figures, errors, the run and its options (secrets never shown).

Every string from the report is escaped: model names, URLs and error reasons come from
the command line, the server and the network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from hstu_replay.report.flags import FLAG_MEANINGS
from hstu_replay.output.page import escape, figures, grid, page, table
from hstu_replay.output.text import NO_VALUE, cell, fmt
from hstu_replay.report.natural import natural_html
from hstu_replay.report.summary import goal_name, latency_table
from hstu_replay.report.charts import charts
from hstu_replay.report.fleet_section import fleet_table
from hstu_replay.report.tier_section import shows_tiers, tier_table
from hstu_replay.report.worker_events import workers_html

#: Option names whose values are never shown (request headers carry auth tokens).
SECRET_OPTION = re.compile(r"(^|_)(headers?|token|password|secret|credentials?|auth)$")
HIDDEN = "(hidden)"
NOT_SET = "(not set)"


def _verdict(thresholds: Mapping | None) -> str:
    if not thresholds:
        return '<p class="verdict none">No thresholds were set.</p>'
    passed = bool(thresholds.get("passed"))
    label = "PASSED" if passed else "FAILED"
    parts = [f'<p class="verdict {"pass" if passed else "fail"}">Thresholds: {label}</p>']
    listed = thresholds.get("violations") or ([f"met: {c}" for c in thresholds.get("checked") or ()] if passed else [])
    if listed:
        parts.append("<ul>" + "".join(f"<li>{escape(v)}</li>" for v in listed) + "</ul>")
    return "".join(parts)


def utc_time(value: float | str | None) -> str:
    """A moment as 'YYYY-MM-DD HH:MM:SS UTC', from epoch seconds or an ISO 8601 string."""
    if value is None or value == "":
        return NO_VALUE
    when = (datetime.fromtimestamp(value, timezone.utc) if isinstance(value, (int, float))
            else datetime.fromisoformat(value))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _seconds(value: float | str) -> float:
    return float(value) if isinstance(value, (int, float)) else datetime.fromisoformat(value).timestamp()


def duration(seconds: float) -> str:
    """'45 s', '2 min 5 s', '1 h 3 min' (rounded to the second)."""
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def _meta(report: Mapping) -> str:
    started, written = (report.get("run") or {}).get("started"), report.get("created")
    parts = [f"{escape(report['tool'])} {escape(report['version'])}", f"started {escape(utc_time(started))}",
             f"report written {escape(utc_time(written))}"]
    if started is not None and written:
        parts[-1] += f" ({escape(duration(_seconds(written) - _seconds(started)))} after the start)"
    return f'<p class="meta">{" &middot; ".join(parts)}</p>'


def _value(value: Any) -> str:
    """An option or run value in words."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value == "":
        return NOT_SET
    return f"{value:g}" if isinstance(value, float) else cell(value)


#: How the run's fields read; fields not named here keep their key.
RUN_LABELS = {
    "model": "model", "interface": "interface", "caches": "model keeps a KV cache",
    "reports_hits": "server reports its cache hits",
    "reports_tiers": "server reports its host-tier hits", "url": "Triton address", "protocol": "protocol",
    "workload": "workload", "source": "data", "users": "users", "workers": "worker processes",
    "role": "written by", "started": "started", "history_caps": "history caps",
}


def _run(run: Mapping) -> str:
    rows = []
    for key, value in run.items():
        if key == "options":
            continue
        if key == "started":
            shown = utc_time(value)
        elif key == "history_caps":
            shown = "; ".join(f"batch {b}: {c:,} items" for b, c in value.items()) if value else "none"
        elif key == "server_limits":
            shown = _server_limits(value)
        else:
            shown = _value(value)
        rows.append([RUN_LABELS.get(key, key.replace("_", " ")), shown])
    return table(["", "value"], rows, text_cols=2)


def _server_limits(section: Mapping | None) -> str:
    """What the server's model published, and the defaults capped to it (run.server_limits)."""
    if section is None:
        return "none published"
    p = section["published"]
    text = (f"batch {p['max_batch']}, {p['max_values']:,} values, {p['max_candidates']} candidates, "
            f"{p['max_history']:,} history items")
    caps = "; ".join(f"{c['option']} {c['asked']:,} capped to {c['used']:,}" for c in section["caps"])
    return f"{text}; {caps}" if caps else text


def _options(options: Mapping | None) -> str:
    if not options:
        return "<p>No options recorded.</p>"
    rows = ([name, HIDDEN if SECRET_OPTION.search(name) else _value(value)] for name, value in options.items())
    return table(["option", "value"], rows, text_cols=2)


#: Where a stage's achieved hit ratio comes from, in words.
SOURCE_LABEL = {"observed": "server-reported (observed)", "predicted": "client cache model (predicted)",
                None: NO_VALUE}


def source_label(source: str | None) -> str:
    return SOURCE_LABEL.get(source, str(source))


def _interval(pair: list) -> str:
    low, high = (fmt(v, ".2f") for v in pair)
    return f"{low} .. {high}"


def _stages(stages: list[dict]) -> str:
    header = ["stage", "batch", "target", "expected", "predicted", "observed", "achieved",
              "achieved from", "hit disagreements", "requests", "mean ms", "ms per logical request",
              "p50 95% CI ms", "p99 95% CI ms", "client CPU peak", "loop lag p99 ms", "flags"]
    rows = ([s["name"], s["batch_size"], goal_name(s["target_ratio"]),
             *(fmt(s[k], ".3f") for k in ("expected_ratio", "predicted_ratio", "observed_ratio", "achieved_ratio")),
             source_label(s["hit_source"]), s["hit_disagreements"], s["requests"],
             *(fmt(s[k], ".3f") for k in ("mean_ms", "ms_per_logical_request")),
             _interval(s["p50_ci_ms"]), _interval(s["p99_ci_ms"]), f"{s['client_cpu_peak']:.0%}",
             fmt(s["loop_lag_p99_ms"], ".1f"),
             "; ".join(f"{f['flag']}: {f['reason']}" for f in s["flags"]) or "ok"] for s in stages)
    return table(header, rows, text_cols=1, text_last=True)


def _flags(stages: list[dict]) -> str:
    """What each flag shown means, and which stages carry it."""
    seen: dict[str, list[str]] = {}
    for s in stages:
        for f in s["flags"]:
            seen.setdefault(f["flag"], []).append(s["name"])
    if not seen:
        return "<p>No stage is flagged: every stage's figures are solid.</p>"
    items = "".join(f"<dt>{escape(flag)} ({escape(', '.join(names))})</dt>"
                    f"<dd>{escape(FLAG_MEANINGS.get(flag, 'see the reasons in the stage table'))}</dd>"
                    for flag, names in seen.items())
    return ("<p>A flagged stage keeps its figures; with thresholds set it fails the run, but for errors and "
            "mismatches where --max-error-ratio or --max-mismatches is set to judge them.</p>"
            f"<dl>{items}</dl>")


def _verification(report: dict) -> str:
    v, p = report["verification"], report["primes"]
    rows = [["verified responses", v["verified"]], ["mismatches", v["mismatches"]],
            ["tolerance", v["tolerance"]], ["priming requests", p["requests"]],
            ["priming failures", p["failures"]], ["warm-up requests", report["warmup_requests"]]]
    return table(["", "count"], rows, text_cols=1)


def _server(bins: list[dict]) -> str:
    with_server = [b for b in bins if isinstance(b.get("server"), dict)]
    if not with_server:
        return "<p>The server reported no per-bin figures.</p>"
    keys: list[str] = []
    for b in with_server:
        keys += [k for k in b["server"] if k not in keys]
    rows = ([b["name"], *(cell(b["server"].get(k)) for k in keys)] for b in with_server)
    return table(["bin", *keys], rows, text_cols=1)


def _errors(report: Mapping) -> str:
    """Failures by cause, most frequent first: the count, the cause (the message with what is
    particular to one request as placeholders) and one whole message of it, each read in full."""
    errors, examples = report["errors"], report["error_examples"]
    if not errors:
        return "<p>No errors.</p>"
    items = "".join(f"<dt>{n:,} &times; {escape(cause)}</dt><dd>e.g. {escape(examples.get(cause))}</dd>"
                    for cause, n in errors.items())
    causes = f"{len(errors)} cause" + ("s" if len(errors) != 1 else "")
    return (f"<p>{sum(errors.values()):,} failures of {causes}, most frequent first: user ids, keys, "
            f"lengths, numbers and addresses read as placeholders, one whole message of each below it.</p>"
            f"<dl>{items}</dl>")


TIERS_NOTE = ("<p>Token hit ratio per tier (reused tokens found on the GPU, onboarded from the host, over the "
              "history tokens sent) and the users of measured requests by tier; from the server where it sends "
              "HOST_CACHED_TOKENS, else the client's two-tier model.</p>")


def tiers_section(report: dict) -> list[str]:
    """The cache-tier heading, note and table where the run has tiers to speak of; else nothing."""
    if not shows_tiers(report):
        return []
    return ["<h2>Cache tiers: GPU hit, host hit, miss</h2>", TIERS_NOTE, grid(tier_table(report))]


def fleet_html(report: dict) -> list[str]:
    """The fleet's heading, note and per-server table for a run against several servers; else nothing."""
    fleet = report.get("fleet")
    if not fleet:
        return []
    return [f"<h2>Fleet: {len(fleet['servers'])} servers, --routing {escape(fleet['routing'])}</h2>",
            "<p>Each server's share of the stage's requests, its hit ratio as it reported it (observed) and as the "
            "client's model of its cache predicted it, its latency and failures; the imbalance is the busiest "
            "server's requests over the mean (the hot-shard and server-lost flags are on the stages).</p>",
            grid(fleet_table(report), text_cols=3)]


def render_html(report: dict) -> str:
    """The whole page."""
    run = report.get("run") or {}
    title = f"hstu-replay report: {run.get('model', 'run')}"
    latency = latency_table(report)
    sections = [
        f"<h1>{escape(title)}</h1>",
        _meta(report),
        _verdict(report.get("thresholds")),
        "<h2>Latency vs hit ratio</h2>",
        figures(charts(report)),
        grid(latency),
        "<h2>Stages: target vs achieved hit ratio</h2>", _stages(report["stages"]),
        *tiers_section(report),
        *fleet_html(report),
        *(natural_html(report["natural"]) if report.get("natural") else ()),
        *workers_html(report),
        "<h2>Flags</h2>", _flags(report["stages"]),
        "<h2>Verification</h2>", _verification(report),
        "<h2>Server-side figures</h2>", _server(report["bins"]),
        "<h2>Errors</h2>", _errors(report),
        "<h2>Run</h2>", _run(run),
        "<h2>Options</h2>", _options(run.get("options")),
    ]
    return page(title, sections)
