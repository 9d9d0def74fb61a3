"""Writing a report to disk: report.json, report.csv, the PNG plots and report.html (SVG charts).

Every file is written to a temporary name beside it and renamed into place, so a killed
process leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
from collections.abc import Callable, Iterable
from pathlib import Path

from hstu_replay.errors import ConfigError
from hstu_replay.report import plots
from hstu_replay.report.html import render_html
from hstu_replay.report.tiers import TIER_COLUMNS, shows_tiers, tier_columns

JSON_NAME = "report.json"
CSV_NAME = "report.csv"
HTML_NAME = "report.html"
SKIPPED_PNG = "skipped: matplotlib is not installed (pip install 'hstu-replay[report]')"


def atomic_write(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same directory and os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    # os.open rather than mkstemp: the file gets the usual umask permissions, not 0600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def report_json(report: dict) -> bytes:
    try:
        import orjson
    except ImportError:  # orjson is a dependency, but the stdlib does as well here
        return json.dumps(report, indent=2, allow_nan=False).encode() + b"\n"
    return orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n"


def write_json(report: dict, out_dir: Path) -> Path:
    return atomic_write(Path(out_dir) / JSON_NAME, report_json(report))


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


def write_csv(report: dict, out_dir: Path) -> Path:
    return atomic_write(Path(out_dir) / CSV_NAME, report_csv(report).encode())


def write_png(report: dict, out_dir: Path, pngs: dict[str, bytes] | None = None) -> Path:
    """Write the plots; returns the latency plot's path (the other two lie beside it)."""
    pngs = plots.render_plots(report) if pngs is None else pngs
    for name, data in pngs.items():
        atomic_write(Path(out_dir) / name, data)
    return Path(out_dir) / plots.LATENCY_PNG


def write_html(report: dict, out_dir: Path) -> Path:
    return atomic_write(Path(out_dir) / HTML_NAME, render_html(report).encode())


WRITERS: dict[str, Callable[[dict, Path], Path]] = {
    "json": write_json,
    "csv": write_csv,
    "png": write_png,
    "html": write_html,
}
_USES_PLOTS = {"png"}  # takes the plots drawn once by write_reports


def write_reports(
    report: dict, out_dir: Path, formats: Iterable[str] = ("json", "csv", "png", "html"),
) -> dict[str, Path | str]:
    """Write each format into `out_dir`; format -> path written, or a note why it was skipped.

    Without matplotlib "png" maps to a note (a str); the HTML page draws its own charts (SVG).
    """
    formats = list(dict.fromkeys(formats))
    unknown = [f for f in formats if f not in WRITERS]
    if unknown:
        raise ConfigError(f"unknown report format {unknown[0]!r}; choose from {', '.join(WRITERS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, bytes] = {}
    if _USES_PLOTS & set(formats) and plots.available():
        pngs = plots.render_plots(report)
    written: dict[str, Path | str] = {}
    for fmt in formats:
        if fmt == "png" and not pngs:
            written[fmt] = SKIPPED_PNG
        elif fmt in _USES_PLOTS:
            written[fmt] = WRITERS[fmt](report, out_dir, pngs=pngs)  # type: ignore[call-arg]
        else:
            written[fmt] = WRITERS[fmt](report, out_dir)
    return written
