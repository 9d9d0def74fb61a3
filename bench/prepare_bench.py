"""Benchmark `hstu-replay data prepare` against a pandas version of NVIDIA's preprocessing.

    python -m bench.prepare_bench                      # full-size synthetic data (~0.9 GB)
    python -m bench.prepare_bench --raw DIR            # reuse raw files (synthetic or real)
    python -m bench.prepare_bench --users 50 --scale 0.05   # a quick small run

Each implementation runs in its own child process, so its wall time and peak RSS (os.wait4's
rusage of that child alone) are its own. Then both outputs are compared array by array: same
users, same order of events, same bitmasks, same contextual codes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hstu_replay.data import schema
from hstu_replay.interface import ACTION_BITS, CONTEXT_KEYS

ROOT = Path(__file__).resolve().parents[1]


def pandas_prepare(raw: Path):
    """NVIDIA's recipe in pandas: per file read_csv + groupby(list), inner merge of the periods,
    list concatenation, a stable per-user sort by time, then the user features merged in."""
    import pandas as pd

    seq = ["video_id", "time_ms", "action_weights"]
    merged = None
    for name in schema.STANDARD_LOGS:
        events = pd.read_csv(raw / name, delimiter=",")
        events["action_weights"] = 0
        for column, weight in ACTION_BITS:
            events["action_weights"] += (events[column] != 0).astype("int64") * weight
        lists = events.groupby("user_id")[seq].agg(list).reset_index()
        del events
        if merged is None:
            merged = lists
            continue
        merged = merged.merge(lists, on="user_id")  # inner join of the two periods
        for column in seq:
            merged[column] = [a + b for a, b in zip(merged[column + "_x"], merged[column + "_y"])]
            merged = merged.drop(columns=[column + "_x", column + "_y"])

    def by_time(row):
        order = sorted(range(len(row["time_ms"])), key=row["time_ms"].__getitem__)  # stable
        return [[row[c][i] for i in order] for c in seq]

    merged[seq] = pd.DataFrame([by_time(r) for _, r in merged.iterrows()], index=merged.index)
    features = pd.read_csv(raw / schema.USER_FEATURES)
    for column in CONTEXT_KEYS:
        codes = {value: i + 1 for i, value in enumerate(features[column].unique())}
        features[column] = features[column].map(codes)
    merged = merged.merge(features[["user_id", *CONTEXT_KEYS]], on="user_id")
    return merged.sort_values("user_id").reset_index(drop=True)


def pandas_to_arrays(frame) -> dict[str, np.ndarray]:
    lengths = np.array([len(v) for v in frame["video_id"]], dtype=np.int64)
    return {
        "user_ids": frame["user_id"].to_numpy(np.int64),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]),
        "video_ids": np.fromiter((x for v in frame["video_id"] for x in v), np.int64),
        "actions": np.fromiter((x for v in frame["action_weights"] for x in v), np.uint8),
        "times_ms": np.fromiter((x for v in frame["time_ms"] for x in v), np.int64),
        "context": frame[list(CONTEXT_KEYS)].to_numpy(np.int64),
    }


def worker(kind: str, raw: Path, out: Path) -> None:
    """Child process: run one implementation, print {"seconds": ...} as the last line."""
    start = time.perf_counter()
    if kind == "ours":
        from hstu_replay.data.prepare import prepare

        prepare(raw, out)
        seconds = time.perf_counter() - start
    else:
        frame = pandas_prepare(raw)
        seconds = time.perf_counter() - start  # the comparison dump below is not timed
        np.savez(out, **pandas_to_arrays(frame))
    print(json.dumps({"seconds": seconds}))


def run_child(kind: str, raw: Path, out: Path) -> dict:
    command = [sys.executable, "-m", "bench.prepare_bench", "--worker", kind, "--raw", str(raw), "--out", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    stdout = child.stdout.read()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{kind} failed with exit code {child.returncode}")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {"kind": kind, "seconds": result["seconds"], "process_s": wall,
            "peak_rss_mb": usage.ru_maxrss / 1024}


def compare(store_dir: Path, pandas_npz: Path) -> list[str]:
    from hstu_replay.data.store import SequenceStore

    store = SequenceStore.open(store_dir)
    theirs = np.load(pandas_npz)
    ours = {
        "user_ids": store.user_ids, "offsets": store.offsets, "video_ids": store.video_ids,
        "actions": store.actions, "times_ms": store.times_ms, "context": store.context,
    }
    return [name for name, array in ours.items() if not np.array_equal(array, theirs[name])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", type=Path, help="existing raw folder (default: synthesize one)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "prepare-bench")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-pandas", action="store_true")
    parser.add_argument("--worker", choices=["ours", "pandas"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.raw, args.out)
        return 0

    args.work.mkdir(parents=True, exist_ok=True)
    raw = args.raw
    if raw is None:
        from hstu_replay.data.synth import synthesize

        raw = args.work / f"raw-u{args.users}-x{args.scale:g}-s{args.seed}"
        if not (raw / schema.USER_FEATURES).is_file():
            start = time.perf_counter()
            report = synthesize(raw, args.users, args.seed, args.scale)
            print(f"{report.line()} in {time.perf_counter() - start:.1f} s")
    sizes = sum((raw / n).stat().st_size for n in schema.STANDARD_LOGS) / 1e6
    print(f"raw: {raw} ({sizes:.0f} MB of standard logs)")

    rows = [run_child("ours", raw, args.work / "store")]
    if not args.skip_pandas:
        rows.append(run_child("pandas", raw, args.work / "pandas.npz"))
    print()
    print(f"{'implementation':<16}{'prepare s':>11}{'process s':>11}{'peak RSS MB':>13}")
    for row in rows:
        print(f"{row['kind']:<16}{row['seconds']:>11.1f}{row['process_s']:>11.1f}"
              f"{row['peak_rss_mb']:>13.0f}")
    if len(rows) == 2:
        print(f"speed-up: {rows[1]['seconds'] / rows[0]['seconds']:.1f}x (prepare s), "
              f"{rows[1]['process_s'] / rows[0]['process_s']:.1f}x (process s)")
        different = compare(args.work / "store", args.work / "pandas.npz")
        if different:
            print(f"MISMATCH: {', '.join(different)} differ between ours and pandas")
            return 1
        print("outputs identical: user_ids, offsets, video_ids, actions, times_ms, context")
    return 0


if __name__ == "__main__":
    sys.exit(main())
