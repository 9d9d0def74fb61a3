"""Where a served request's time goes, by Triton's own statistics: queue, input, model, output.

    python -m bench.gpu_triton_stats --http-port 8000 --save before.json
    ... requests ...
    python -m bench.gpu_triton_stats --http-port 8000 --since before.json

Reads `/v2/models/<model>/stats` of every model and prints, per model that served requests in
between, the mean milliseconds per request of each phase Triton times: queue, compute_input
(inputs handed to the backend), compute_infer (the backend's execute: for PyTriton the stub, its
proxy and our engine; for the Python-backend repository the stub and our engine), compute_output,
and the whole request on the server (success). A client's latency minus `success` is the
network, protocol and client side.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

PHASES = ("queue", "compute_input", "compute_infer", "compute_output", "success")


def snapshot(http_port: int) -> dict[str, dict[str, tuple[int, int]]]:
    """model -> phase -> (count, total ns)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/models/stats", timeout=10) as answer:
        data = json.load(answer)
    models = {}
    for entry in data.get("model_stats", []):
        stats = entry.get("inference_stats", {})
        models[entry["name"]] = {p: (int(stats.get(p, {}).get("count", 0)), int(stats.get(p, {}).get("ns", 0)))
                                 for p in PHASES}
    return models


def per_request_ms(before: dict, after: dict) -> dict[str, dict[str, float | int]]:
    """model -> {'requests': n, phase: mean ms per request} for models that served requests in between."""
    out = {}
    for model, phases in after.items():
        old = before.get(model, {})
        requests = phases["success"][0] - old.get("success", (0, 0))[0]
        if requests <= 0:
            continue
        row: dict[str, float | int] = {"requests": requests}
        for phase, (count, ns) in phases.items():
            done = count - old.get(phase, (0, 0))[0]
            row[phase] = round((ns - old.get(phase, (0, 0))[1]) / 1e6 / done, 4) if done else 0.0
        out[model] = row
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--save", help="write the current statistics here")
    parser.add_argument("--since", help="print the mean per request since this saved snapshot")
    args = parser.parse_args()
    now = snapshot(args.http_port)
    if args.save:
        Path(args.save).write_text(json.dumps(now))
    if args.since:
        try:
            before = json.loads(Path(args.since).read_text())
        except (OSError, ValueError) as exc:
            print(f"--since {args.since}: not a saved snapshot ({exc})", file=sys.stderr)
            return 2
        for model, row in per_request_ms(before, now).items():
            phases = ", ".join(f"{p} {row[p]:.3f}" for p in PHASES)
            print(f"triton stats {model}: {row['requests']} requests; ms per request: {phases}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
