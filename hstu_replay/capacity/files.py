"""A capacity result on disk: capacity.json, capacity.csv (one row per step), the two charts as
.svg files and the self-contained capacity.html, all from one dict (`capacity.result`).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from hstu_replay.capacity.charts import THROUGHPUT_SVG, chart_files
from hstu_replay.capacity.driver import CapacityResult
from hstu_replay.capacity.page import render_html
from hstu_replay.capacity.result import capacity_dict
from hstu_replay.output.chart import standalone
from hstu_replay.output.files import atomic_write, json_bytes

JSON_NAME = "capacity.json"
CSV_NAME = "capacity.csv"
HTML_NAME = "capacity.html"


STEP_FIELDS = ["load", "passed", "requests", "throughput_rps", "logical_throughput", "requested_rps", "mean_ms",
               "p50_ms", "p99_ms", "latency_basis", "error_ratio", "achieved_ratio", "power",
               "client_cpu_ms_per_request", "client_bound", "returncode", "report_dir"]


def _flat(prefix: str, mapping: dict | None) -> dict:
    return {f"{prefix}_{k}": v for k, v in (mapping or {}).items()}


def capacity_csv(data: dict) -> str:
    """One row per step, with its ratio's verdicts and the server figures as server_/triton_/cache_ columns."""
    rows = []
    for r in data["ratios"]:
        best, knee = (r["sustainable"] or {}).get("load"), (r["knee"] or {}).get("load")
        for s in r["steps"]:
            m = s.get("metrics") or {}
            rows.append({**(r.get("pools") or {}), "hit_ratio": r["hit_ratio"], **{k: s[k] for k in STEP_FIELDS},
                         "breaches": "; ".join(s["breaches"]), "sustainable": s["load"] == best,
                         "knee": s["load"] == knee, "servers_needed": r["servers_needed"],
                         "workers_needed": (r["workers"] or {}).get("workers"),
                         **_flat("server", s.get("server")), **_flat("triton", m.get("triton")),
                         **_flat("cache", m.get("cache"))})
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    return buf.getvalue()


def write_capacity(result: CapacityResult, fleet_checks: list[dict] | None = None) -> dict[str, Path]:
    """Write every file into the plan's out dir; format -> path (svg: the throughput chart).
    `fleet_checks`: --verify-fleet's runs of the fleets the plan names (capacity.fleet_check)."""
    out = Path(result.plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = capacity_dict(result)
    if fleet_checks is not None:
        data["fleet_checks"] = fleet_checks
    svgs = chart_files(data)
    written = {"json": atomic_write(out / JSON_NAME, json_bytes(data)),
               "csv": atomic_write(out / CSV_NAME, capacity_csv(data).encode())}
    for name, svg in svgs.items():
        atomic_write(out / name, standalone(svg))
    written["svg"] = out / THROUGHPUT_SVG
    written["html"] = atomic_write(out / HTML_NAME, render_html(data, svgs).encode())
    return written
