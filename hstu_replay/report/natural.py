"""A natural replay's figures: the hit ratio each request met, latency binned by it, and both over time.

Read from the run's records files (every request, exact latency, the server's hits where it
reports them): `report.json["natural"]`, `natural_requests.csv` (one row per request) and the
report page's section.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from hstu_replay.plan.over_limit import ACCOUNTS_HEADER, HistoryPolicy, VisitAccounts, accounts_rows
from hstu_replay.plan.timeline import label_accounts, label_visits
from hstu_replay.output.page import escape, table
from hstu_replay.output.text import cell
from hstu_replay.stats.histogram import LatencyHistogram

RATIO_BINS = 10  # [0, 0.1), ..., [0.9, 1.0]
TIME_WINDOWS = 20
NATURAL_CSV = "natural_requests.csv"


def _ratio(record: dict) -> tuple[int, str]:
    """Hit tokens of a request and whose word they are."""
    if record.get("observed_hits") is not None:
        return int(record["observed_hits"]), "observed"
    return int(record["predicted_hits"]), "predicted"


def _latency(records: list[dict]) -> dict:
    h = LatencyHistogram()
    for r in records:
        h.record_us(round(r["latency_ms"] * 1e3))
    tokens = sum(r["tokens"] for r in records)
    hits = sum(_ratio(r)[0] for r in records)
    return {"requests": len(records), "hit_ratio": hits / tokens if tokens else None,
            "mean_ms": sum(r["latency_ms"] for r in records) / len(records) if records else None,
            "p50_ms": h.percentile_ms(50) if records else None, "p99_ms": h.percentile_ms(99) if records else None}


def visit_kinds(records: list[dict], policy: HistoryPolicy) -> dict:
    """The visits the requests' labels name, by kind (warm, cold, rebased, frozen, skipped)."""
    total = VisitAccounts()
    for r in records:
        total = total + label_accounts(r["label"])
    return total.to_dict(policy)


def failures(records: list[dict]) -> dict:
    """Requests that got no answer, and their visits: each visit's user continues on a fresh key
    (its key is replaced), so the curve of the window is recomputed without what those keys held."""
    failed = [r for r in records if not r["ok"]]
    visits = [list(v) for r in failed for v in label_visits(r["label"])]
    return {"requests": len(failed), "keys_replaced": len(visits), "visits": visits}


def natural_section(records: list[dict], policy: HistoryPolicy = HistoryPolicy()) -> dict:
    """Measured requests that got an answer: their emergent ratios, latency by ratio, over time;
    and every visit of the requests sent (answered or not) by kind under the `--over-limit` policy."""
    tried = [r for r in records if r["kind"] in ("measure", "warmup")]
    sent = sorted((r for r in tried if r["ok"]), key=lambda r: r["t"])
    measured = [r for r in sent if r["kind"] == "measure"]
    sources = sorted({_ratio(r)[1] for r in measured})
    by_ratio = []
    for i in range(RATIO_BINS):
        low, high = i / RATIO_BINS, (i + 1) / RATIO_BINS
        inside = [r for r in measured if low <= _ratio(r)[0] / r["tokens"] < high
                  or (i == RATIO_BINS - 1 and _ratio(r)[0] == r["tokens"])]
        if inside:
            by_ratio.append({"from": low, "to": high, **_latency(inside)})
    over_time = []
    if sent:
        start, width = sent[0]["t"], max(sent[-1]["t"] - sent[0]["t"], 1e-9) / TIME_WINDOWS
        windows: list[list[dict]] = [[] for _ in range(TIME_WINDOWS)]
        for r in sent:
            windows[min(int((r["t"] - start) / width), TIME_WINDOWS - 1)].append(r)
        over_time = [{"from_s": w * width, "to_s": (w + 1) * width,
                      "warmup": all(r["kind"] == "warmup" for r in inside), **_latency(inside)}
                     for w, inside in enumerate(windows) if inside]
    return {"hit_source": sources[0] if len(sources) == 1 else "mixed" if sources else None,
            **_latency(measured), "warmup_requests": len(sent) - len(measured),
            "by_ratio": by_ratio, "over_time": over_time, "requests_csv": NATURAL_CSV,
            "visit_kinds": visit_kinds(tried, policy), "failed": failures(tried),
            "measured_visit_kinds": visit_kinds([r for r in tried if r["kind"] == "measure"], policy)}


def natural_html(section: dict) -> tuple[str, ...]:
    """The report page's part: the hit ratio that emerged, latency binned by it, and both over time."""
    keys = ("requests", "hit_ratio", "mean_ms", "p50_ms", "p99_ms")
    return (
        "<h2>Natural replay: the hit ratio that emerged</h2>",
        f"<p>{escape(section['requests'])} measured requests met a hit ratio of {escape(cell(section['hit_ratio']))} "
        f"({escape(section['hit_source'])}); every request in <code>{escape(section['requests_csv'])}</code>.</p>",
        table(["hit ratio", *keys], ([f"{b['from']:.1f}-{b['to']:.1f}", *(cell(b[k]) for k in keys)]
                                     for b in section["by_ratio"]), text_cols=1),
        table(["seconds", "warm-up", *keys],
              ([f"{w['from_s']:.0f}-{w['to_s']:.0f}", "yes" if w["warmup"] else "", *(cell(w[k]) for k in keys)]
               for w in section["over_time"]), text_cols=2),
        *_kinds_html(section),
        *_failed_html(section.get("failed")),
    )


def _failed_html(failed: dict | None) -> tuple[str, ...]:
    if not failed or not failed["requests"]:
        return ()
    return (f"<p>{escape(failed['requests'])} requests failed; {escape(failed['keys_replaced'])} keys replaced: "
            "those users continue on fresh keys, their next visit hitting nothing.</p>",)


def _kinds_html(section: dict) -> tuple[str, ...]:
    kinds = section.get("visit_kinds")
    if not kinds:
        return ()
    keep = f", keeping {kinds['rebase_keep']:g} of the limit" if kinds["rebase_keep"] is not None else ""
    return (f"<p>Histories past the limit: <code>--over-limit {escape(kinds['over_limit'])}</code>{escape(keep)}. "
            f"Every visit of the requests sent (warm-up included; skipped visits are counted with the "
            f"request that followed them):</p>",
            table(ACCOUNTS_HEADER, accounts_rows(kinds), text_cols=1))


def write_natural_csv(records: list[dict], out_dir: Path) -> Path:
    text = io.StringIO()
    rows = csv.writer(text)
    rows.writerow(["t", "kind", "latency_ms", "tokens", "hit_tokens", "hit_ratio", "hit_source", "ok", "label"])
    for r in sorted(records, key=lambda r: r["t"]):
        hits, source = _ratio(r)
        rows.writerow([f"{r['t']:.6f}", r["kind"], f"{r['latency_ms']:.3f}", r["tokens"], hits,
                       f"{hits / r['tokens']:.6f}" if r["tokens"] else "", source, r["ok"], r["label"]])
    path = Path(out_dir) / NATURAL_CSV
    path.write_text(text.getvalue())
    return path
