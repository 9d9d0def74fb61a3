"""capacity.html: the settings, the capacity per hit ratio, the charts, the steps and the server's
metrics of a capacity result, on one self-contained page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hstu_replay.capacity.tables import (
    POOLS_NOTE, SUSTAINABLE_NOTE, load_text, pools_table, saturation_lines, steps_table, summary_table,
    worker_lines,
)
from hstu_replay.output.page import escape, figures, grid, page
from hstu_replay.output.text import cell


def _metrics_rows(data: dict) -> list[list[Any]]:
    keys: list[str] = []
    for r in data["ratios"]:
        for s in r["steps"]:
            for group, values in (s.get("metrics") or {}).items():
                keys += [f"{group}.{k}" for k in values if f"{group}.{k}" not in keys]
    rows: list[list[Any]] = [["hit ratio", "load", *keys]]
    for r in data["ratios"]:
        for s in r["steps"]:
            m = s.get("metrics") or {}
            cells = []
            for key in keys:
                group, name = key.split(".", 1)
                value = (m.get(group) or {}).get(name)
                cells.append(cell(value, 1) if isinstance(value, float) else value)
            rows.append([f"{r['hit_ratio']:.2f}", load_text(s["load"]), *cells])
    return rows


def fleet_checks_html(data: dict) -> list[str]:
    """--verify-fleet: each plan's fleet, run at the target rate, beside what the plan promised."""
    checks = data.get("fleet_checks")
    if not checks:
        return []
    rows = [["hit ratio", "servers", "req/s offered", "p99 ms planned", "p99 ms measured", "logical req/s",
             "imbalance", "hit ratio per server", "verdict"]]
    for c in checks:
        per_server = ", ".join("-" if r["observed_ratio"] is None else f"{r['observed_ratio']:.3f}"
                               for r in c["per_server"])
        rows.append([c["hit_ratio"], c["servers"], c["request_rate"], c["planned_p99_ms"], c["measured_p99_ms"],
                     c["measured_logical_rps"], c["imbalance"], per_server,
                     "meets the SLO" if c["meets_slo"] else "MISSES the SLO: " + "; ".join(c["breaches"])])
    return ["<h2>The fleet each plan names, run (--verify-fleet)</h2>",
            "<p>The servers the plan answers, started on loopback with the cache it measured, driven at the "
            "target rate with key-hash routing: one step, judged against the same SLO.</p>",
            grid(rows, text_cols=0, text_last=True)]


def render_html(data: dict, svgs: Mapping[str, str]) -> str:
    """The page, with the charts (`capacity.charts.chart_files`) inline."""
    failed = data["unsustainable"]
    verdict = (f'<p class="verdict fail">No step met the SLO at hit ratio '
               f'{escape(", ".join(f"{r:.2f}" for r in failed))}</p>' if failed
               else '<p class="verdict pass">Every hit ratio has a sustainable step</p>')
    settings = [["", "value"], ["model", data["model"]], ["SLO p99 (ms)", data["slo"]["p99_ms"]],
                ["SLO error ratio", data["slo"]["error_ratio"]], ["load", data["load"]["unit"]],
                ["load steps", ", ".join(load_text(x) for x in data["load"]["steps"])],
                ["batch size", data["batch_size"]], ["step seconds", data["step_seconds"]],
                ["warm-up seconds", data["warmup_seconds"]], ["target logical requests/s", data["target_rps"]],
                ["share of a core per Locust worker", data["worker_cpu_share"]],
                ["workload", " ".join(data["workload_args"])], ["Locust arguments", " ".join(data["locust_args"])]]
    if data["pools"]:
        settings += [["pools (GPU, host tokens)", ", ".join(f"({p['gpu_tokens']:,}, {p['host_tokens']:,})"
                                                            for p in data["pools"])],
                     ["offload mode", data["pools"][0]["offload_mode"]], ["repository", data["repository"]],
                     ["server arguments", " ".join(data["serve_args"])]]
    metrics_rows = _metrics_rows(data)
    sections = [
        f"<h1>{escape('hstu-replay capacity: ' + str(data['model']))}</h1>",
        f'<p class="meta">{escape(data["tool"])} {escape(data["version"])}, created {escape(data["created"])}</p>',
        verdict,
        "<h2>Settings</h2>", grid(settings, text_cols=2),
        "<h2>Capacity per hit ratio</h2>",
        f"<p>{escape(SUSTAINABLE_NOTE)} Knee: the step of highest power (throughput / mean latency). "
        "Workers: Locust worker processes to send the target (or, without one, the sustainable rate): "
        "ceil(requests/s x client CPU per request / share of a core per worker).</p>",
        grid(summary_table(data), text_cols=1),
        "".join(f"<p>{escape(line)}</p>" for line in saturation_lines(data)),
        "".join(f"<p>{escape(line)}</p>" for line in worker_lines(data)),
        figures(svgs.values()),
        *((f"<h2>Users per GPU per tier budget</h2><p>{escape(POOLS_NOTE)}</p>", grid(pools_table(data), text_cols=2))
          if data["pools"] else ()),
        *fleet_checks_html(data),
        "<h2>Steps</h2>", grid(steps_table(data), text_cols=1, text_last=True),
        "<h2>Server metrics per step (Prometheus deltas)</h2>",
        (grid(metrics_rows, text_cols=1) if len(metrics_rows[0]) > 2
         else "<p>No metrics endpoint was scraped.</p>"),
    ]
    return page(f"hstu-replay capacity: {data['model']}", sections)
