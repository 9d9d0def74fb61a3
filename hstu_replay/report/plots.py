"""PNG plots of a report: latency, speed-up and throughput against the achieved hit ratio.

matplotlib is optional and imported only when a plot is drawn, on the kit's figures (their own
Agg canvas, no pyplot: a process that already uses pyplot elsewhere is left alone).
"""

from __future__ import annotations

from typing import Any

from hstu_replay.report import kit, svg

LATENCY_PNG = "latency_vs_hit_ratio.png"
SPEEDUP_PNG = "speedup_vs_hit_ratio.png"
THROUGHPUT_PNG = "throughput_vs_hit_ratio.png"
PLOT_NAMES = (LATENCY_PNG, SPEEDUP_PNG, THROUGHPUT_PNG)

def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _series(report: dict, key: str) -> dict[int, tuple[list[float], list[float]]]:
    """batch size -> (achieved ratios, values), sorted by ratio; bins lacking either left out."""
    return {batch: ([p.x for p in points], [p.y for p in points]) for batch, points in svg.series(report, key).items()}


def _axes(title: str, ylabel: str) -> tuple[Any, Any]:
    fig = kit.figure()
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel("achieved hit ratio")
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _png(fig: Any, ax: Any, has_data: bool, handles: list | None = None) -> bytes:
    if has_data:
        # outside the axes, on the right: lines are never hidden behind the legend
        ax.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return kit.png(fig)


def latency_plot(report: dict) -> bytes:
    fig, ax = _axes("Latency vs hit ratio", "latency (ms)")
    from matplotlib.lines import Line2D

    # colour tells the batch size, marker and line style the statistic: the legend stays
    # batches + 3 entries long however many batch sizes there are
    styles = {"p50_ms": ("p50", {"marker": "o"}),
              "p99_ms": ("p99", {"marker": "^", "alpha": 0.7}),
              "mean_ms": ("mean", {"linestyle": "--"})}
    series = {key: _series(report, key) for key in styles}
    batches = sorted(set().union(*series.values()))
    handles = []
    for i, batch in enumerate(batches):
        color = f"C{i % 10}"
        for key, (_, style) in styles.items():
            if batch in series[key]:
                ax.plot(*series[key][batch], color=color, **style)
        handles.append(Line2D([], [], color=color, linewidth=6, label=f"batch {batch}"))
    handles += [Line2D([], [], color="black", label=label, **style)
                for label, style in styles.values()]
    ax.set_ylim(bottom=0)
    return _png(fig, ax, bool(batches), handles)


def speedup_plot(report: dict) -> bytes:
    fig, ax = _axes("Speed-up over no cache reuse", "speed-up (x)")
    series = _series(report, "speedup")
    if series:
        ax.axhline(1.0, color="grey", linewidth=0.8)
    for i, (batch, xy) in enumerate(series.items()):
        ax.plot(*xy, color=f"C{i % 10}", marker="o", label=f"batch {batch}")
    return _png(fig, ax, bool(series))


def throughput_plot(report: dict) -> bytes:
    fig, ax = _axes("Throughput vs hit ratio", "requests / s")
    series = _series(report, "throughput_rps")
    for i, (batch, xy) in enumerate(series.items()):
        ax.plot(*xy, color=f"C{i % 10}", marker="o", label=f"batch {batch}")
    ax.set_ylim(bottom=0)
    return _png(fig, ax, bool(series))


def render_plots(report: dict) -> dict[str, bytes]:
    """File name -> PNG bytes of every plot; raises ImportError without matplotlib."""
    return {
        LATENCY_PNG: latency_plot(report),
        SPEEDUP_PNG: speedup_plot(report),
        THROUGHPUT_PNG: throughput_plot(report),
    }
