"""A capacity result's tables and lines, read from capacity.json's dict: on the terminal (each
step as it finishes, the summary at the end) and on capacity.html.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hstu_replay.capacity.driver import LOAD_KINDS
from hstu_replay.capacity.pools import TargetPools
from hstu_replay.capacity.result import SERVERS_BASIS, step_dict
from hstu_replay.capacity.search import StepResult
from hstu_replay.capacity.worker_count import MASTER_NOTE
from hstu_replay.output.text import NO_VALUE, fmt, format_table


def load_text(value: Any) -> str:
    return fmt(value, "g")


SUMMARY_HEADER = ["hit ratio", "sustainable", "passed up to", "req/s", "logical/s", "server req/s", "p99 ms", "knee",
                  "servers", "workers", "hits from", "stopped at"]

#: What the summary's load columns mean, under the summary on the terminal and the page.
SUSTAINABLE_NOTE = ("sustainable: of the steps that met the SLO (p99 and error ratio), the one with the highest "
                    "logical throughput; servers = ceil(target / its logical/s). passed up to: the highest load "
                    "that met the SLO (the search stops at the first breach).")

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
        rows.append([*_pools_cells(data, r), f"{r['hit_ratio']:.2f}", load_text(s.get("load")),
                     load_text((r["within_slo"] or {}).get("load")), fmt(s.get("throughput_rps"), ".1f"),
                     fmt(s.get("logical_throughput"), ".1f"), fmt(s.get("server_rps"), ".1f"),
                     fmt(s.get("p99_ms"), ".2f"),
                     load_text(k.get("load")) + ("" if not k or k["passed"] else " (breach)"),
                     fmt(r["servers_needed"], "d"), fmt((r["workers"] or {}).get("workers"), "d"),
                     r.get("hits_from") or NO_VALUE, load_text(r["stopped_at"])])
    return rows


def saturation_lines(data: dict) -> list[str]:
    """Where loads above the sustainable one also met the SLO, one line saying why they are not it:
    they carried no more (the server was saturated: more load only waited longer)."""
    unit = LOAD_KINDS[data["load"]["kind"]].column
    lines = []
    for r in data["ratios"]:
        best = r["sustainable"]
        if best is None:
            continue
        above = [s for s in r["steps"] if s["passed"] and s["load"] > best["load"]]
        if above:
            loads = ", ".join(load_text(s["load"]) for s in above)
            rates = ", ".join(fmt(s["logical_throughput"], ".1f") for s in above)
            lines.append(f"{series_label(r)}: sustainable at {unit} {load_text(best['load'])} "
                         f"({best['logical_throughput']:.1f} logical/s); {unit} {loads} also met the SLO but "
                         f"carried no more ({rates} logical/s): the server was saturated")
    return lines


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


def steps_header(load_column: str) -> list[str]:
    """The step tables' columns: the load's (users, or offered req/s) second, the verdict last."""
    return ["hit ratio", load_column, "req/s", "logical/s", "server req/s", "p50 ms", "p99 ms", "error ratio",
            "achieved", "queue us", "compute us", "verdict"]


STEP_CELL_WIDTH = 8  # at least, per column of a step line: 60000.00 lines up under its header


def step_row(hit_ratio: float, step: dict, sustainable: bool = False) -> list[str]:
    triton = (step.get("metrics") or {}).get("triton") or {}
    verdict = ("pass" + (" (sustainable)" if sustainable else "") if step["passed"]
               else "BREACH: " + "; ".join(step["breaches"]))
    return [f"{hit_ratio:.2f}", load_text(step["load"]), fmt(step["throughput_rps"], ".1f"),
            fmt(step["logical_throughput"], ".1f"), fmt(step["server_rps"], ".1f"),
            fmt(step["p50_ms"], ".2f"), fmt(step["p99_ms"], ".2f"), fmt(step["error_ratio"], ".4f"),
            fmt(step["achieved_ratio"], ".3f"), fmt(triton.get("mean_queue_us"), ".0f"),
            fmt(triton.get("mean_compute_us"), ".0f"), verdict]


def steps_table(data: dict) -> list[list[str]]:
    """Header plus every step, the sustainable one of each ratio marked in its verdict."""
    header = _pools_header(data) + steps_header(LOAD_KINDS[data["load"]["kind"]].column)
    return [header] + [_pools_cells(data, r) + step_row(r["hit_ratio"], s, _is_sustainable(r, s))
                       for r in data["ratios"] for s in r["steps"]]


def _is_sustainable(ratio: dict, step: dict) -> bool:
    return ratio["sustainable"] is not None and step["passed"] and step["load"] == ratio["sustainable"]["load"]


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
        rows.append([*_pools_cells(data, r), f"{r['hit_ratio']:.2f}", load_text(s.get("load")),
                     fmt(r["slo_crossing"], ".1f"), fmt(s.get("logical_throughput"), ".1f"),
                     fmt(s.get("p99_ms"), ".2f"), load_text(r["stopped_at"])])
    return rows


POOLS_NOTE = ("Per tier budget: the reference target served with each (GPU, host) pair in turn, one server "
              "standing for one GPU. Per GPU: the highest load measured within the SLO (its logical requests/s "
              "and p99 beside it); at the SLO: the load where "
              "p99 meets the SLO on a straight line between the last passing step and the step that broke it "
              "(an estimate; empty where the search did not break by p99 after a passing step).")


def _step_cells(row: list[str], header: list[str]) -> str:
    """A step line's cells right-aligned under `header`'s (the verdict, last, as it is)."""
    return "  ".join([*(c.rjust(max(len(h), STEP_CELL_WIDTH)) for c, h in zip(row[:-1], header[:-1])), row[-1]])


def step_header_line(load_column: str) -> str:
    """The header above the progress lines of the steps."""
    header = steps_header(load_column)
    return _step_cells(header, header)


def step_line(hit_ratio: float, step: StepResult, out_dir: Path, load_column: str) -> str:
    """One progress line for a finished step, its cells under `step_header_line`'s."""
    return _step_cells(step_row(hit_ratio, step_dict(step, out_dir)), steps_header(load_column))


def series_label(ratio: dict) -> str:
    """A hit ratio's name in charts and lines: 'hit ratio 0.80', with its pools where the run served pools."""
    pools = ratio.get("pools")
    return f"hit ratio {ratio['hit_ratio']:.2f}" + (f" {TargetPools(**pools).name}" if pools else "")


def format_summary(data: dict) -> str:
    notes = [f"hits from {kind}: {basis}" for kind, basis in SERVERS_BASIS.items()
             if any(r.get("hits_from") == kind for r in data["ratios"])]
    pools = ["", "per tier budget (one server = one GPU):", format_table(pools_table(data))] if data["pools"] else []
    return "\n".join([format_table(summary_table(data)), SUSTAINABLE_NOTE, *saturation_lines(data), *notes,
                      *worker_lines(data), *pools])
