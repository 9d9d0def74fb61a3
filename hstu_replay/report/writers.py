"""Writing a report to disk: report.json, report.csv, the SVG charts and report.html (the same
charts inline), each file written whole (`output.files.atomic_write`).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from hstu_replay.errors import ConfigError
from hstu_replay.output.chart import standalone
from hstu_replay.output.files import atomic_write, json_bytes
from hstu_replay.report.charts import LATENCY_SVG, chart_files
from hstu_replay.report.html import render_html
from hstu_replay.report.tier_section import TIER_COLUMNS, shows_tiers, tier_columns

JSON_NAME = "report.json"
CSV_NAME = "report.csv"
FLEET_CSV_NAME = "fleet.csv"
#: fleet.csv's columns of each server's row
FLEET_COLUMNS = ("server", "index", "requests", "errors", "failures", "share", "throughput_rps", "observed_ratio",
                 "predicted_ratio", "achieved_ratio", "hit_source", "hit_disagreements", "p50_ms", "p99_ms", "p99_ci_ms",
                 "mean_ms", "ms_per_logical_request", "prime_requests", "server_down_s")
HTML_NAME = "report.html"


def write_json(report: dict, out_dir: Path) -> Path:
    return atomic_write(Path(out_dir) / JSON_NAME, json_bytes(report))


def _csv_value(value: object) -> object:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def report_csv(report: dict) -> str:
    """One row per bin: the bin's fields, its stage's tier columns where the run has tiers to speak
    of (as the HTML report's tier section), then the server's figures as server_<key>."""
    bins = report["bins"]
    fields = [k for k in (bins[0] if bins else {}) if k != "server"]
    tiers = list(TIER_COLUMNS) if shows_tiers(report) else []
    stages = {s["name"]: tier_columns(s) for s in report.get("stages", [])}
    server_keys: list[str] = []
    for b in bins:
        server_keys += [k for k in (b.get("server") or {}) if k not in server_keys]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(fields + tiers + [f"server_{k}" for k in server_keys])
    for b in bins:
        server = b.get("server") or {}
        stage = stages.get(b["name"], {})
        w.writerow([_csv_value(b.get(k)) for k in fields] + [_csv_value(stage.get(k)) for k in tiers]
                   + [_csv_value(server.get(k)) for k in server_keys])
    return buf.getvalue()


def fleet_csv(report: dict) -> str:
    """One row per (stage, server) of a fleet."""
    fields = ["stage", "batch_size", "target_ratio", "imbalance", *FLEET_COLUMNS]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(fields)
    for stage in report["fleet"]["stages"]:
        for row in stage["servers"]:
            w.writerow([_csv_value(v) for v in (stage["name"], stage["batch_size"], stage["target_ratio"],
                                                stage["imbalance"], *(row.get(k) for k in FLEET_COLUMNS))])
    return buf.getvalue()


def write_csv(report: dict, out_dir: Path) -> Path:
    """report.csv, and fleet.csv beside it for a run against several servers."""
    if report.get("fleet"):
        atomic_write(Path(out_dir) / FLEET_CSV_NAME, fleet_csv(report).encode())
    return atomic_write(Path(out_dir) / CSV_NAME, report_csv(report).encode())


def write_svg(report: dict, out_dir: Path) -> Path:
    """Write the charts; returns the latency chart's path (the other two lie beside it)."""
    for name, svg in chart_files(report).items():
        atomic_write(Path(out_dir) / name, standalone(svg))
    return Path(out_dir) / LATENCY_SVG


def write_html(report: dict, out_dir: Path) -> Path:
    return atomic_write(Path(out_dir) / HTML_NAME, render_html(report).encode())


WRITERS: dict[str, Callable[[dict, Path], Path]] = {
    "json": write_json,
    "csv": write_csv,
    "svg": write_svg,
    "html": write_html,
}


def write_reports(report: dict, out_dir: Path, formats: Iterable[str] = tuple(WRITERS)) -> dict[str, Path]:
    """Write each format into `out_dir`; format -> path written."""
    formats = list(dict.fromkeys(formats))
    unknown = [f for f in formats if f not in WRITERS]
    if unknown:
        raise ConfigError(f"unknown report format {unknown[0]!r}; choose from {', '.join(WRITERS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {fmt: WRITERS[fmt](report, out_dir) for fmt in formats}
