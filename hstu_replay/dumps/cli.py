"""`hstu-replay dump inspect DIR [--json]`: what a reference dump holds, without torch."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from hstu_replay.arguments import Option
from hstu_replay.dumps.reader import LOGITS, DumpBatch, read_dump, read_dump_feature_keys


def add_commands(groups: Any) -> None:
    dump = groups.add_parser("dump", help="read NVIDIA reference dump directories",
                             epilog="example: hstu-replay dump inspect runs/dumps")
    commands = dump.add_subparsers(dest="dump_command", required=True, metavar="COMMAND")
    inspect = commands.add_parser("inspect", help="summarise each batch of a dump directory",
                                   epilog="example: hstu-replay dump inspect runs/dumps --json")
    Option("directory", "directory of batch_NNNNNN_*.pt files", metavar="DIR").add_to(inspect)
    Option("--json", "print one JSON object with dtype, shape, min, max, sum per tensor", type=bool).add_to(inspect)
    inspect.set_defaults(func=inspect_command)


def _number(value: Any, integral: bool) -> int | float | None:
    if integral:
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None  # JSON has no NaN/inf


def tensor_stats(array: np.ndarray) -> dict[str, Any]:
    """dtype, shape, min, max and sum; integer sums are exact Python ints."""
    integral = array.dtype.kind in "iub"
    stats: dict[str, Any] = {"dtype": str(array.dtype), "shape": list(array.shape)}
    if array.size == 0:
        return {**stats, "min": None, "max": None, "sum": 0 if integral else 0.0}
    lo, hi = array.min(), array.max()
    if not integral:
        total: int | float | None = _number(array.sum(dtype=np.float64), False)
    elif max(abs(int(lo)), abs(int(hi))) * array.size < 2**63:
        total = int(array.sum(dtype=np.int64))
    else:  # could overflow int64: add as Python ints
        total = sum(array.ravel().tolist())
    return {**stats, "min": _number(lo, integral), "max": _number(hi, integral), "sum": total}


def _summary(batch: DumpBatch) -> str:
    t = batch.tensors
    candidates = t["num_candidates"]
    logits = next((k for k in LOGITS if k in t), None)
    shown = f"{logits} {list(t[logits].shape)}" if logits else "no logits"
    return (f"{batch.name}: {candidates.size} users, {t['values'].size} values, "
            f"{int(candidates.sum())} candidates, {shown}")


def inspect_command(args: argparse.Namespace) -> int:
    batches = read_dump(args.directory)  # everything is read (and checked) before any output
    if args.json:
        report = {"batches": [
            {"name": b.name, "tensors": {k: tensor_stats(v) for k, v in b.tensors.items()}}
            for b in batches]}
        print(json.dumps(report, allow_nan=False))
        return 0
    keys = read_dump_feature_keys(args.directory)
    print(f"{args.directory}: {len(batches)} batches"
          + (f", feature keys {', '.join(keys)}" if keys is not None else ""))
    for batch in batches:
        print(_summary(batch))
    return 0
