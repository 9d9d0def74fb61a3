"""protocol.html: the protocol's two tables and its passes on one self-contained page.

Every string is escaped (model names and URLs come from the command line and the server).
"""

from __future__ import annotations

import json

from hstu_replay.protocol.tables import backend_rows, hardware_line, scaling_rows
from hstu_replay.output.page import CSS, escape, grid, page
from hstu_replay.output.text import NO_VALUE

#: the report pages' style; in these tables the first column is text, a flag reads red
STYLE = CSS + "td:first-child { text-align: left; } .flag { color: #8a1414; }\n"


def _passes(report: dict) -> list[list[str]]:
    keys = ["model", "batch_size", "pass", "calls", "e2e_s", "ms_per_logical_request", "cached_fraction",
            "verified", "mismatches", "server_calls"]
    rows = [keys]
    for p in report["passes"]:
        rows.append([f"{p[k]:.4g}" if isinstance(p[k], float) else NO_VALUE if p[k] is None else str(p[k])
                     for k in keys])
    return rows


def render_protocol_html(report: dict) -> str:
    flags = "".join(f'<li class="flag">{escape(f)}</li>' for f in report["flags"]) or "<li>none</li>"
    body = [
        f"<h1>{escape(report['tool'])}: NVIDIA's benchmark protocol</h1>",
        f"<p>{escape(report['version'])}, created {escape(report['created'])}. {escape(hardware_line(report))}.</p>",
        f"<p>{escape(report['definition'])}.</p>",
        f"<h2>Backend comparison, batch {report['backend_comparison']['batch_size']}</h2>",
        grid(backend_rows(report)),
        f"<h2>Batch-size scaling ({escape(report['batch_scaling']['model'])})</h2>",
        grid(scaling_rows(report)),
        "<h2>Flags</h2>", f"<ul>{flags}</ul>",
        "<h2>Passes</h2>", grid(_passes(report)),
        "<h2>Run</h2>", f"<pre>{escape(json.dumps(report['run'], indent=2, sort_keys=True))}</pre>",
    ]
    return page("hstu-replay protocol", body, css=STYLE)
