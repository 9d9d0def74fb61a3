"""protocol.html: the protocol's two tables and its passes on one self-contained page.

Every string is escaped (model names and URLs come from the command line and the server).
"""

from __future__ import annotations

import html
import json

from hstu_replay.benchmark.tables import backend_rows, hardware_line, scaling_rows

STYLE = ("body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:80em;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:.2em .6em;"
         "text-align:right}th{background:#f2f2f2}td:first-child{text-align:left}.flag{color:#8a1414}")


def _table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows[1:])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _passes(report: dict) -> list[list[str]]:
    keys = ["model", "batch_size", "pass", "calls", "e2e_s", "ms_per_logical_request", "cached_fraction",
            "verified", "mismatches", "server_calls"]
    rows = [keys]
    for p in report["passes"]:
        rows.append([f"{p[k]:.4g}" if isinstance(p[k], float) else ("-" if p[k] is None else str(p[k]))
                     for k in keys])
    return rows


def render_protocol_html(report: dict) -> str:
    e = html.escape
    flags = "".join(f'<li class="flag">{e(f)}</li>' for f in report["flags"]) or "<li>none</li>"
    body = [
        f"<h1>{e(report['tool'])}: NVIDIA's benchmark protocol</h1>",
        f"<p>{e(report['version'])}, created {e(report['created'])}. {e(hardware_line(report))}.</p>",
        f"<p>{e(report['definition'])}.</p>",
        f"<h2>Backend comparison, batch {report['backend_comparison']['batch_size']}</h2>",
        _table(backend_rows(report)),
        f"<h2>Batch-size scaling ({e(report['batch_scaling']['model'])})</h2>",
        _table(scaling_rows(report)),
        "<h2>Flags</h2>", f"<ul>{flags}</ul>",
        "<h2>Passes</h2>", _table(_passes(report)),
        "<h2>Run</h2>", f"<pre>{e(json.dumps(report['run'], indent=2, sort_keys=True))}</pre>",
    ]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>hstu-replay protocol</title>'
            f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n")
