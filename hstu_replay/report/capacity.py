"""The capacity result on disk and on the terminal: capacity.json, capacity.csv, two PNGs and a
self-contained capacity.html, all built from one dict (`capacity_dict`).

Plots use matplotlib's Figure on an Agg canvas (no pyplot), and are skipped without matplotlib.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hstu_replay
from hstu_replay.capacity.driver import CapacityPlan, CapacityResult
from hstu_replay.capacity.pools import TargetPools
from hstu_replay.capacity.search import RatioResult, StepResult, slo_crossing
from hstu_replay.capacity.workers import MASTER_NOTE, plan_workers
from hstu_replay.report import kit, plots
from hstu_replay.report.kit import NO_VALUE, escape, fmt, grid, page, png_img
from hstu_replay.report.summary import format_table, jsonable
from hstu_replay.report.writers import atomic_write, report_json

JSON_NAME = "capacity.json"
CSV_NAME = "capacity.csv"
HTML_NAME = "capacity.html"
THROUGHPUT_PNG = "capacity_throughput.png"
P99_PNG = "capacity_p99.png"


# -- the one dict everything reads ------------------------------------------------------------

def _step(step: StepResult, out_dir: Path) -> dict:
    m = step.measurement
    report_dir = m.report_dir
    if report_dir is not None:
        try:
            report_dir = str(Path(report_dir).resolve().relative_to(out_dir.resolve()))
        except ValueError:
            pass
    return {
        "load": m.load, "passed": step.passed, "breaches": list(step.breaches),
        "requests": m.requests, "throughput_rps": m.throughput_rps, "logical_throughput": m.logical_throughput,
        "requested_rps": m.requested_rps, "mean_ms": m.mean_ms, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms,
        "latency_basis": m.latency_basis, "error_ratio": m.error_ratio, "achieved_ratio": m.achieved_ratio,
        "hit_source": m.hit_source, "primes_per_request": m.primes_per_request, "server_rps": m.server_rps,
        "power": m.power, "client_cpu_ms_per_request": m.client_cpu_ms_per_request, "client_bound": m.client_bound,
        "server": m.server, "metrics": m.metrics, "errors": m.errors,
        "report_dir": report_dir, "returncode": m.returncode,
    }


def _pick(step: StepResult | None, *keys: str) -> dict | None:
    if step is None:
        return None
    m = step.measurement
    return {"load": m.load, "passed": step.passed, **{k: getattr(m, k) for k in keys}}


def _ratio(r: RatioResult, plan: CapacityPlan, pools: TargetPools | None) -> dict:
    stopped = r.stopped_at
    workers = plan_workers(r, plan.batch_size, plan.target_rps, plan.worker_cpu_share)
    return {
        "hit_ratio": r.hit_ratio,
        "pools": None if pools is None else pools.as_dict(),
        "steps": [_step(s, plan.out_dir) for s in r.steps],
        "sustainable": _pick(r.sustainable, "throughput_rps", "logical_throughput", "p99_ms", "error_ratio",
                             "server_rps", "primes_per_request"),
        "knee": _pick(r.knee, "power", "throughput_rps", "logical_throughput", "mean_ms", "p99_ms"),
        "servers_needed": r.servers_needed,
        "hits_from": r.hits_from,
        "servers_needed_basis": SERVERS_BASIS.get(r.hits_from),
        "workers": None if workers is None else asdict(workers),
        "stopped_at": None if stopped is None else stopped.load,
        "within_slo": _pick(r.within_slo, "logical_throughput", "p99_ms"),
        "slo_crossing": slo_crossing(r.steps, plan.slo),
    }


def capacity_dict(result: CapacityResult) -> dict:
    """What capacity.json holds (strict JSON: NaN written as null)."""
    p = result.plan
    return jsonable({
        "tool": "hstu-replay", "version": hstu_replay.__version__, "created": result.created,
        "model": p.model,
        "slo": {"p99_ms": p.slo.p99_ms, "error_ratio": p.slo.error_ratio},
        "load": {"kind": p.load_kind.name, "unit": p.load_kind.unit, "steps": list(p.loads),
                 "rate_users": p.rate_users if p.load_kind.name == "rate" else None},
        "batch_size": p.batch_size, "step_seconds": p.step_seconds, "warmup_seconds": p.warmup_seconds,
        "step_timeout_s": p.step_timeout_s, "target_rps": p.target_rps, "worker_cpu_share": p.worker_cpu_share,
        "workload_args": list(p.workload_args), "locust_args": list(p.locust_args),
        "metrics_url": p.metrics_url, "cache_metrics_url": p.cache_metrics_url,
        "pools": [pools.as_dict() for pools in p.pools], "repository": p.repository, "serve_args": list(p.serve_args),
        "passed": not result.unsustainable, "unsustainable": result.unsustainable,
        "ratios": [_ratio(r, p, pools) for r, pools in zip(result.ratios, result.pools_of())],
    })


# -- tables -----------------------------------------------------------------------------------

def _load(value: Any) -> str:
    return fmt(value, "g")


SUMMARY_HEADER = ["hit ratio", "sustainable", "req/s", "logical/s", "server req/s", "p99 ms", "knee", "servers",
                  "workers", "hits from", "stopped at"]

#: What a ratio's fleet size means, by where its hits came from.
SERVERS_BASIS = {
    "none": "measured traffic, cold cache",
    "reuse": "measured traffic whose hits come from reused keys",
    "priming": "upper bound: the server also computed a priming request before each measured one",
}


POOLS_HEADER = ["GPU tokens", "host tokens"]


def _pools_cells(data: dict, ratio: dict) -> list[str]:
    """The GPU and host pools a ratio was measured with, where the run served pools; else nothing."""
    if not data["pools"]:
        return []
    return [f"{ratio['pools']['gpu_tokens']:,}", f"{ratio['pools']['host_tokens']:,}"]


def _pools_header(data: dict) -> list[str]:
    return list(POOLS_HEADER) if data["pools"] else []


def summary_table(data: dict) -> list[list[str]]:
    """Header plus one row per hit ratio (and pools): sustainable load and throughput, knee, fleet size."""
    rows = [_pools_header(data) + SUMMARY_HEADER]
    for r in data["ratios"]:
        s, k = r["sustainable"] or {}, r["knee"] or {}
        rows.append([*_pools_cells(data, r), f"{r['hit_ratio']:.2f}", _load(s.get("load")), fmt(s.get("throughput_rps"), ".1f"),
                     fmt(s.get("logical_throughput"), ".1f"), fmt(s.get("server_rps"), ".1f"),
                     fmt(s.get("p99_ms"), ".2f"),
                     _load(k.get("load")) + ("" if not k or k["passed"] else " (breach)"),
                     fmt(r["servers_needed"], "d"), fmt((r["workers"] or {}).get("workers"), "d"),
                     r.get("hits_from") or NO_VALUE, _load(r["stopped_at"])])
    return rows


def _rate(rps: float) -> str:
    return f"{rps:,.0f}" if rps >= 100 else f"{rps:.3g}"


def worker_line(data: dict, ratio: dict) -> str | None:
    """`workers needed for 250 req/s (target 2,000 logical/s) at b8 h0.50: 1 (client CPU 0.42 ms/request,
    70% of a core per worker)`; None where the ratio has no worker figure."""
    w = ratio["workers"]
    if w is None:
        return None
    basis = (f"target {_rate(data['target_rps'])} logical/s" if w["basis"] == "target"
             else "one server's sustainable rate")
    bound = "; measured in a client-bound step" if w["client_bound"] else ""
    return (f"workers needed for {_rate(w['rate_rps'])} req/s ({basis}) at b{data['batch_size']} "
            f"h{ratio['hit_ratio']:.2f}: {w['workers']} (client CPU {w['cpu_ms_per_request']:.3g} ms/request, "
            f"{w['core_share']:.0%} of a core per worker{bound})")


def worker_lines(data: dict) -> list[str]:
    """One line per hit ratio with a worker figure, then what the master costs."""
    lines = [line for r in data["ratios"] if (line := worker_line(data, r)) is not None]
    return [*lines, MASTER_NOTE] if lines else []


STEPS_HEADER = ["hit ratio", "load", "req/s", "logical/s", "p50 ms", "p99 ms", "error ratio", "achieved",
                "queue us", "compute us", "verdict"]


def step_row(hit_ratio: float, step: dict) -> list[str]:
    triton = (step.get("metrics") or {}).get("triton") or {}
    verdict = "pass" if step["passed"] else "BREACH: " + "; ".join(step["breaches"])
    return [f"{hit_ratio:.2f}", _load(step["load"]), fmt(step["throughput_rps"], ".1f"),
            fmt(step["logical_throughput"], ".1f"),
            fmt(step["p50_ms"], ".2f"), fmt(step["p99_ms"], ".2f"), fmt(step["error_ratio"], ".4f"),
            fmt(step["achieved_ratio"], ".3f"), fmt(triton.get("mean_queue_us"), ".0f"),
            fmt(triton.get("mean_compute_us"), ".0f"), verdict]


def steps_table(data: dict) -> list[list[str]]:
    return [_pools_header(data) + STEPS_HEADER] + [_pools_cells(data, r) + step_row(r["hit_ratio"], s)
                                                   for r in data["ratios"] for s in r["steps"]]


def pools_table(data: dict) -> list[list[str]]:
    """Header plus one row per (pools, hit ratio): the load one server (one GPU) carried within the
    SLO, measured (the sustainable step) and interpolated to where p99 meets the SLO; [] without pools."""
    if not data["pools"]:
        return []
    unit = data["load"]["unit"]
    rows = [[*POOLS_HEADER, "hit ratio", f"{unit} per GPU", "at the SLO (interpolated)", "logical/s", "p99 ms",
             "stopped at"]]
    for r in data["ratios"]:
        s = r["within_slo"] or {}
        rows.append([*_pools_cells(data, r), f"{r['hit_ratio']:.2f}", _load(s.get("load")),
                     fmt(r["slo_crossing"], ".1f"), fmt(s.get("logical_throughput"), ".1f"),
                     fmt(s.get("p99_ms"), ".2f"), _load(r["stopped_at"])])
    return rows


POOLS_NOTE = ("Per tier budget: the reference target served with each (GPU, host) pair in turn, one server "
              "standing for one GPU. Per GPU: the highest load measured within the SLO (its logical requests/s "
              "and p99 beside it); at the SLO: the load where "
              "p99 meets the SLO on a straight line between the last passing step and the step that broke it "
              "(an estimate; empty where the search did not break by p99 after a passing step).")


def step_line(hit_ratio: float, step: StepResult, out_dir: Path) -> str:
    """One progress line for a finished step."""
    return "  ".join(c for c in step_row(hit_ratio, _step(step, out_dir)))


# -- CSV --------------------------------------------------------------------------------------

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


# -- plots ------------------------------------------------------------------------------------

def series_label(ratio: dict) -> str:
    """A hit ratio's name in plots and lines: 'hit ratio 0.80', with its pools where the run served pools."""
    pools = ratio.get("pools")
    return f"hit ratio {ratio['hit_ratio']:.2f}" + (f" {TargetPools(**pools).name}" if pools else "")


def _series(data: dict, key: str) -> list[tuple[str, list[tuple[float, float, bool]]]]:
    """Per hit ratio (and pools): its label and (load, value, passed) of every step with a value."""
    return [(series_label(r), [(s["load"], s[key], s["passed"]) for s in r["steps"] if s[key] is not None])
            for r in data["ratios"]]


def _plot(data: dict, key: str, title: str, ylabel: str, decorate: Callable[[Any], None]) -> bytes:
    from matplotlib.ticker import NullLocator

    fig = kit.figure()
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(f"load ({data['load']['unit']})")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    loads = [x for x in data["load"]["steps"] if x > 0]
    if loads and max(loads) / min(loads) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(loads, labels=[f"{x:g}" for x in loads])
    ax.xaxis.set_minor_locator(NullLocator())
    drawn = False
    for i, (label, points) in enumerate(_series(data, key)):
        if not points:
            continue
        color = f"C{i % 10}"
        ax.plot([x for x, _, _ in points], [y for _, y, _ in points], color=color, marker="o",
                label=label)
        breached = [(x, y) for x, y, ok in points if not ok]
        if breached:
            ax.plot(*zip(*breached), linestyle="none", marker="X", markersize=11, color=color)
        drawn = True
    decorate(ax)
    if drawn:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return kit.png(fig)


def throughput_plot(data: dict) -> bytes:
    def decorate(ax):
        if data["load"]["kind"] == "rate":  # what was offered, to compare against what was carried
            steps = data["load"]["steps"]
            ax.plot(steps, steps, color="grey", linestyle="--", linewidth=1, label="offered")
        ax.set_ylim(bottom=0)

    return _plot(data, "throughput_rps", "Throughput vs load (X: SLO breached)", "requests / s", decorate)


def _two_and_five(value: float, _position: Any) -> str:
    """Minor log ticks: label only 2x and 5x a power of ten, so decades never crowd."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (2.0, 5.0)) else ""


def p99_plot(data: dict) -> bytes:
    slo = data["slo"]["p99_ms"]

    def decorate(ax):
        ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO p99 {slo:g} ms")
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")  # latency past the knee grows by orders of magnitude
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_two_and_five))

    return _plot(data, "p99_ms", "p99 latency vs load (X: SLO breached)", "p99 latency (ms)", decorate)


PLOTS: dict[str, Callable[[dict], bytes]] = {THROUGHPUT_PNG: throughput_plot, P99_PNG: p99_plot}


def render_plots(data: dict) -> dict[str, bytes]:
    """File name -> PNG; empty without matplotlib."""
    return {name: draw(data) for name, draw in PLOTS.items()} if plots.available() else {}


# -- HTML -------------------------------------------------------------------------------------

def _metrics_rows(data: dict) -> list[list[Any]]:
    keys: list[str] = []
    for r in data["ratios"]:
        for s in r["steps"]:
            for group, figures in (s.get("metrics") or {}).items():
                keys += [f"{group}.{k}" for k in figures if f"{group}.{k}" not in keys]
    rows: list[list[Any]] = [["hit ratio", "load", *keys]]
    for r in data["ratios"]:
        for s in r["steps"]:
            m = s.get("metrics") or {}
            cells = []
            for key in keys:
                group, name = key.split(".", 1)
                value = (m.get(group) or {}).get(name)
                cells.append(kit.cell(value, 1) if isinstance(value, float) else value)
            rows.append([f"{r['hit_ratio']:.2f}", _load(s["load"]), *cells])
    return rows


def render_html(data: dict, pngs: dict[str, bytes]) -> str:
    failed = data["unsustainable"]
    verdict = (f'<p class="verdict fail">No step met the SLO at hit ratio '
               f'{escape(", ".join(f"{r:.2f}" for r in failed))}</p>' if failed
               else '<p class="verdict pass">Every hit ratio has a sustainable step</p>')
    settings = [["", "value"], ["model", data["model"]], ["SLO p99 (ms)", data["slo"]["p99_ms"]],
                ["SLO error ratio", data["slo"]["error_ratio"]], ["load", data["load"]["unit"]],
                ["load steps", ", ".join(_load(x) for x in data["load"]["steps"])],
                ["batch size", data["batch_size"]], ["step seconds", data["step_seconds"]],
                ["warm-up seconds", data["warmup_seconds"]], ["target logical requests/s", data["target_rps"]],
                ["share of a core per Locust worker", data["worker_cpu_share"]],
                ["workload", " ".join(data["workload_args"])], ["Locust arguments", " ".join(data["locust_args"])]]
    if data["pools"]:
        settings += [["pools (GPU, host tokens)", ", ".join(f"({p['gpu_tokens']:,}, {p['host_tokens']:,})"
                                                            for p in data["pools"])],
                     ["offload mode", data["pools"][0]["offload_mode"]], ["repository", data["repository"]],
                     ["server arguments", " ".join(data["serve_args"])]]
    images = "".join(png_img(name, png) for name, png in pngs.items())
    metrics_rows = _metrics_rows(data)
    sections = [
        f"<h1>{escape('hstu-replay capacity: ' + str(data['model']))}</h1>",
        f'<p class="meta">{escape(data["tool"])} {escape(data["version"])}, created {escape(data["created"])}</p>',
        verdict,
        "<h2>Settings</h2>", grid(settings, text_cols=2),
        "<h2>Capacity per hit ratio</h2>",
        "<p>Sustainable: the SLO-passing step of highest throughput. Knee: the step of highest power "
        "(throughput / mean latency). Servers: ceil(target / sustainable logical throughput). "
        "Workers: Locust worker processes to send the target (or, without one, the sustainable rate): "
        "ceil(requests/s x client CPU per request / share of a core per worker).</p>",
        grid(summary_table(data), text_cols=1),
        "".join(f"<p>{escape(line)}</p>" for line in worker_lines(data)),
        images or "<p>Plots unavailable (matplotlib not installed).</p>",
        *((f"<h2>Users per GPU per tier budget</h2><p>{escape(POOLS_NOTE)}</p>", grid(pools_table(data), text_cols=2))
          if data["pools"] else ()),
        "<h2>Steps</h2>", grid(steps_table(data), text_cols=1, text_last=True),
        "<h2>Server metrics per step (Prometheus deltas)</h2>",
        (grid(metrics_rows, text_cols=1) if len(metrics_rows[0]) > 2
         else "<p>No metrics endpoint was scraped.</p>"),
    ]
    return page(f"hstu-replay capacity: {data['model']}", sections)


# -- writing ----------------------------------------------------------------------------------

def write_capacity(result: CapacityResult) -> dict[str, Path]:
    """Write every file into the plan's out dir; format -> path (PNG: the throughput plot)."""
    out = Path(result.plan.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = capacity_dict(result)
    pngs = render_plots(data)
    written = {"json": atomic_write(out / JSON_NAME, report_json(data)),
               "csv": atomic_write(out / CSV_NAME, capacity_csv(data).encode())}
    for name, png in pngs.items():
        atomic_write(out / name, png)
    if pngs:
        written["png"] = out / THROUGHPUT_PNG
    written["html"] = atomic_write(out / HTML_NAME, render_html(data, pngs).encode())
    return written


def format_summary(data: dict) -> str:
    notes = [f"hits from {kind}: {basis}" for kind, basis in SERVERS_BASIS.items()
             if any(r.get("hits_from") == kind for r in data["ratios"])]
    pools = ["", "per tier budget (one server = one GPU):", format_table(pools_table(data))] if data["pools"] else []
    return "\n".join([format_table(summary_table(data)), *notes, *worker_lines(data), *pools])

