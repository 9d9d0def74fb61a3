"""Several runs of NVIDIA's protocol side by side: the range of each figure, not one run's point.

    python -m bench.protocol_runs OUT/protocol-cpp          # every protocol.json below the folder
    python -m bench.protocol_runs A/protocol.json B/protocol.json ...

Runs of one server and code move by up to 20% at batch 8 (14 timed calls a pass), so a figure is
given as the lowest, the median and the highest of its runs. Runs are grouped by the hardware
line their report carries (machine, config, engine, frontend, client protocol); for each group and
batch size: cold and fully cached ms per logical request and the hit speed-up, the runs that were
not complete or had mismatches, and at batch 8 NVIDIA's published rows beside them (from the
reports themselves). Prints one markdown table; exit 2 with one line when no report is found or
one cannot be read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness import table

REPORT = "protocol.json"


@dataclass(frozen=True)
class Spread:
    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(min(values), statistics.median(values), max(values))

    def text(self, unit: str = "") -> str:
        return f"{self.low:.3f}{unit} / {self.median:.3f}{unit} / {self.high:.3f}{unit}"


def reports(paths: list[Path]) -> list[dict]:
    """Every report under `paths` (files, or folders searched for protocol.json), read."""
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob(REPORT))})
    if not files:
        raise ValueError(f"no {REPORT} under {', '.join(map(str, paths))}")
    read = []
    for f in files:
        try:
            read.append(json.loads(f.read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{f}: {exc}") from None
    return read


def rows(runs: list[dict]) -> list[list]:
    """One row per (hardware line, batch size), in the order the groups were first seen."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(run["run"]["hardware"], []).append(run)
    out = []
    for hardware, members in groups.items():
        by_batch: dict[int, list[dict]] = {}
        for run in members:
            for row in run["batch_scaling"]["rows"]:
                by_batch.setdefault(row["batch_size"], []).append({**row, "complete": run["run"]["complete"]})
        for batch, seen in sorted(by_batch.items()):
            cold, hit = Spread.of([r["no_cache_ms"] for r in seen]), Spread.of([r["hit_ms"] for r in seen])
            speedup = Spread.of([r["speedup"] for r in seen])
            faults = sum(1 for r in seen if r["mismatches"] or not r["complete"])
            nvidia = "; ".join(f"{n['layers']} layers {n['hit_ms']:g} ms, {n['speedup']:g}x"
                               for n in seen[0]["nvidia"])
            out.append([hardware, batch, len(seen), cold.text(), hit.text(), speedup.text("x"), faults, nvidia])
    return out


HEADER = ["runs of", "batch", "runs", "cold ms (low / median / high)", "fully cached ms", "hit speed-up",
          "incomplete or mismatched", "NVIDIA (published)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help=f"{REPORT} files, or folders holding them")
    args = parser.parse_args(argv)
    try:
        found = reports(args.paths)
        print(table(HEADER, rows(found)))
    except (ValueError, KeyError, TypeError) as exc:
        detail = f"a report lacks {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"protocol_runs: {detail}", file=sys.stderr)
        return 2
    print(f"\n{len(found)} runs; ms per logical request (NVIDIA's definition, in each report)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
