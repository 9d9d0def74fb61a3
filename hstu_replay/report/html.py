"""One self-contained HTML page of a report: inline CSS, plots as data URIs, no scripts or links.

Every string from the report is escaped: model names, URLs and error reasons come from
the command line, the server and the network.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable, Mapping
from typing import Any

from hstu_replay.report.plots import PLOT_NAMES
from hstu_replay.report.summary import NO_VALUE, latency_table, target_name

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: right; }
th { background: #f2f2f2; } td.text { text-align: left; }
.verdict { padding: .6em 1em; border-radius: 4px; font-weight: bold; }
.pass { background: #e3f6e3; color: #185c18; } .fail { background: #fbe4e4; color: #8a1414; }
.none { background: #f2f2f2; color: #555; }
img { display: block; margin: .8em 0; max-width: 100%; }
.meta { color: #666; }
"""


def _e(value: Any) -> str:
    return html.escape(NO_VALUE if value is None else str(value), quote=True)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return NO_VALUE if value is None else str(value)


def _table(header: Iterable[Any], rows: Iterable[Iterable[Any]], text_cols: int = 0, text_last: bool = False) -> str:
    """A table; the first `text_cols` columns (and the last, with `text_last`) are left-aligned
    text, the rest figures."""
    header = list(header)
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = [f'<td class="text">{_e(c)}</td>' if i < text_cols or (text_last and i == len(header) - 1)
                 else f"<td>{_e(c)}</td>" for i, c in enumerate(row)]
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _verdict(thresholds: Mapping | None) -> str:
    if not thresholds:
        return '<p class="verdict none">No thresholds were set.</p>'
    passed = bool(thresholds.get("passed"))
    label = "PASSED" if passed else "FAILED"
    parts = [f'<p class="verdict {"pass" if passed else "fail"}">Thresholds: {label}</p>']
    violations = thresholds.get("violations") or []
    if violations:
        parts.append("<ul>" + "".join(f"<li>{_e(v)}</li>" for v in violations) + "</ul>")
    return "".join(parts)


def _run(run: Mapping) -> str:
    return _table(["", "value"], ([k, _cell(v)] for k, v in run.items()), text_cols=2)


def _images(png_bytes: Mapping[str, bytes]) -> str:
    names = [n for n in PLOT_NAMES if n in png_bytes] + sorted(set(png_bytes) - set(PLOT_NAMES))
    return "".join(
        f'<img alt="{_e(n)}" src="data:image/png;base64,'
        f'{base64.b64encode(png_bytes[n]).decode("ascii")}">' for n in names)


#: Where a stage's achieved hit ratio comes from, in words.
SOURCE_LABEL = {"observed": "server-reported (observed)", "predicted": "client cache model (predicted)",
                None: NO_VALUE}


def _interval(pair: list) -> str:
    low, high = (NO_VALUE if v is None else f"{v:.2f}" for v in pair)
    return f"{low} .. {high}"


def _stages(stages: list[dict]) -> str:
    header = ["stage", "batch", "target", "expected", "predicted", "observed", "achieved",
              "achieved from", "hit disagreements", "requests", "mean ms", "ms per logical request",
              "p50 95% CI ms", "p99 95% CI ms", "client CPU peak", "loop lag p99 ms", "flags"]
    rows = ([s["name"], s["batch_size"], target_name(s["target_ratio"]),
             *(NO_VALUE if s[k] is None else f"{s[k]:.3f}"
               for k in ("expected_ratio", "predicted_ratio", "observed_ratio", "achieved_ratio")),
             SOURCE_LABEL[s["hit_source"]], s["hit_disagreements"], s["requests"],
             *(NO_VALUE if s[k] is None else f"{s[k]:.3f}" for k in ("mean_ms", "ms_per_logical_request")),
             _interval(s["p50_ci_ms"]), _interval(s["p99_ci_ms"]), f"{s['client_cpu_peak']:.0%}",
             NO_VALUE if s["loop_lag_p99_ms"] is None else f"{s['loop_lag_p99_ms']:.1f}",
             "; ".join(f"{f['flag']}: {f['reason']}" for f in s["flags"]) or "ok"] for s in stages)
    return _table(header, rows, text_cols=1, text_last=True)


def _verification(report: dict) -> str:
    v, p = report["verification"], report["primes"]
    rows = [["verified responses", v["verified"]], ["mismatches", v["mismatches"]],
            ["tolerance", v["tolerance"]], ["priming requests", p["requests"]],
            ["priming failures", p["failures"]], ["warm-up requests", report["warmup_requests"]]]
    return _table(["", "count"], rows, text_cols=1)


def _server(bins: list[dict]) -> str:
    with_server = [b for b in bins if isinstance(b.get("server"), dict)]
    if not with_server:
        return "<p>The server reported no per-bin figures.</p>"
    keys: list[str] = []
    for b in with_server:
        keys += [k for k in b["server"] if k not in keys]
    rows = ([b["name"], *(_cell(b["server"].get(k)) for k in keys)] for b in with_server)
    return _table(["bin", *keys], rows, text_cols=1)


def _errors(errors: Mapping[str, int]) -> str:
    if not errors:
        return "<p>No errors.</p>"
    rows = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))
    return _table(["reason", "count"], rows, text_cols=1)


def _natural(section: Mapping) -> tuple[str, ...]:
    """A natural replay: the hit ratio that emerged, latency binned by it, and both over time."""
    keys = ("requests", "hit_ratio", "mean_ms", "p50_ms", "p99_ms")
    return (
        "<h2>Natural replay: the hit ratio that emerged</h2>",
        f"<p>{_e(section['requests'])} measured requests met a hit ratio of {_e(_cell(section['hit_ratio']))} "
        f"({_e(section['hit_source'])}); every request in <code>{_e(section['requests_csv'])}</code>.</p>",
        _table(["hit ratio", *keys], ([f"{b['from']:.1f}-{b['to']:.1f}", *(_cell(b[k]) for k in keys)]
                                      for b in section["by_ratio"]), text_cols=1),
        _table(["seconds", "warm-up", *keys],
               ([f"{w['from_s']:.0f}-{w['to_s']:.0f}", "yes" if w["warmup"] else "", *(_cell(w[k]) for k in keys)]
                for w in section["over_time"]), text_cols=2),
    )


def render_html(report: dict, png_bytes: Mapping[str, bytes]) -> str:
    """The whole page; `png_bytes` (file name -> PNG) may be empty when plots are unavailable."""
    run = report.get("run") or {}
    title = f"hstu-replay report: {run.get('model', 'run')}"
    table = latency_table(report)
    sections = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{_e(report["tool"])} {_e(report["version"])}, '
        f'created {_e(report["created"])}</p>',
        _verdict(report.get("thresholds")),
        "<h2>Run</h2>", _run(run),
        "<h2>Latency vs hit ratio</h2>", _table(table[0], table[1:]),
        _images(png_bytes) if png_bytes else "<p>Plots unavailable (matplotlib not installed).</p>",
        "<h2>Stages: target vs achieved hit ratio</h2>", _stages(report["stages"]),
        *(_natural(report["natural"]) if report.get("natural") else ()),
        "<h2>Verification</h2>", _verification(report),
        "<h2>Server-side figures</h2>", _server(report["bins"]),
        "<h2>Errors</h2>", _errors(report["errors"]),
    ]
    body = "\n".join(sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
