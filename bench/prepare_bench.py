"""Benchmark `hstu-replay data prepare` against DuckDB (and pandas) doing NVIDIA's preprocessing.

    python -m bench.prepare_bench                           # full-size 1K synthetic data (~0.9 GB)
    python -m bench.prepare_bench --release 27k --users 3000   # 27K layout (part files), 35M rows
    python -m bench.prepare_bench --raw DIR                 # reuse raw files (synthetic or real)
    python -m bench.prepare_bench --users 50 --scale 0.05   # a quick small run

Each implementation runs in a child process of its own (`bench.harness.measured_child`), which
reports its wall time and its own peak RSS (getrusage: every thread, DuckDB's included). The
reference is `read`: pyarrow's multithreaded CSV reader over the same files and columns, one
file at a time, doing nothing with them: the time of reading the CSVs. Then every output is compared with ours array
by array: same users, same order of events, same bitmasks, same contextual codes.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import ROOT, measured_child, table, this_command
from hstu_replay.data import schema
from hstu_replay.data.limits import DEFAULT_MEMORY_GB
from hstu_replay.interface import ACTION_BITS, CONTEXT_KEYS

# --- the implementations (each runs in a worker child) --------------------------------------------


def read_only(raw: Path, out: Path, memory_gb: float) -> dict:
    """The reference: parse every standard log with pyarrow's multithreaded CSV reader, the columns
    used only, one file at a time, and drop it."""
    import pyarrow.csv as pacsv

    from hstu_replay.data.bounded import find_raw_files
    from hstu_replay.data.prepare import LOG_TYPES

    rows = 0
    convert = pacsv.ConvertOptions(column_types=LOG_TYPES, include_columns=list(LOG_TYPES))
    for _, path in find_raw_files(raw, include_random=False).logs:
        rows += pacsv.read_csv(path, convert_options=convert).num_rows
    del out, memory_gb
    return {"rows": rows}


def ours(raw: Path, out: Path, memory_gb: float) -> None:
    from hstu_replay.data.bounded import prepare_bounded

    prepare_bounded(raw, out, memory_gb=memory_gb)


def in_memory(raw: Path, out: Path, memory_gb: float) -> None:
    from hstu_replay.data.prepare import prepare

    del memory_gb
    prepare(raw, out)


def events_sql(files) -> list[str]:
    """One SELECT per standard log: its rows in file order (`file`, `row`), the action bitmask, the period."""
    bitmask = " + ".join(f"(CASE WHEN {name} <> 0 THEN {weight} ELSE 0 END)" for name, weight in ACTION_BITS)
    return [f"SELECT user_id, video_id, time_ms, ({bitmask})::UTINYINT AS action, {period} AS period, "
            f"{k} AS file, row_number() OVER () AS row FROM read_csv('{path}', header = true)"
            for k, (period, path) in enumerate(files.logs)]


def duckdb_sql(files, out: Path, memory_gb: float, work: Path) -> str:
    """NVIDIA's recipe in one DuckDB statement: per file the rows in file order, users in both
    periods, lists ordered by time (ties: file order), the user features' first-appearance codes."""
    parts = events_sql(files)
    codes = [f"c{i} AS (SELECT v, row_number() OVER (ORDER BY min(r)) AS code FROM "
             f"(SELECT {key} AS v, r FROM feat) GROUP BY v)" for i, key in enumerate(CONTEXT_KEYS)]
    order = "ORDER BY time_ms, file, row"
    return f"""
        SET memory_limit = '{memory_gb}GB'; SET threads = 2; SET temp_directory = '{work}';
        COPY (
            WITH ev AS ({" UNION ALL ".join(parts)}),
            kept AS (SELECT user_id FROM ev WHERE period = 0 INTERSECT SELECT user_id FROM ev WHERE period = 1),
            feat AS (SELECT *, row_number() OVER () AS r FROM read_csv('{files.user_features}', header = true,
                     all_varchar = true)),
            {", ".join(codes)},
            ctx AS (SELECT feat.user_id::BIGINT AS user_id, {", ".join(f"c{i}.code AS k{i}" for i in range(len(CONTEXT_KEYS)))}
                    FROM feat {" ".join(f"JOIN c{i} ON feat.{key} = c{i}.v" for i, key in enumerate(CONTEXT_KEYS))})
            SELECT user_id, list(video_id {order}) AS video_ids, list(action {order}) AS actions,
                   list(time_ms {order}) AS times_ms, any_value(ctx.k0) AS k0, any_value(ctx.k1) AS k1,
                   any_value(ctx.k2) AS k2, any_value(ctx.k3) AS k3, any_value(ctx.k4) AS k4
            FROM ev JOIN kept USING (user_id) JOIN ctx USING (user_id)
            GROUP BY user_id ORDER BY user_id
        ) TO '{out}' (FORMAT parquet);
    """


def duckdb_flat_sql(files, out: Path, memory_gb: float, work: Path) -> str:
    """The same events as `duckdb_sql`, without the per-user lists: one row per event of a kept,
    featured user, sorted by user, time, file and row (the sequences as a sorted table, which is
    the store's arrays): what a DuckDB user turns to when the lists do not fit."""
    parts = events_sql(files)
    return f"""
        SET memory_limit = '{memory_gb}GB'; SET threads = 2; SET temp_directory = '{work}';
        COPY (
            WITH ev AS ({" UNION ALL ".join(parts)}),
            kept AS (SELECT user_id FROM ev WHERE period = 0 INTERSECT SELECT user_id FROM ev WHERE period = 1),
            featured AS (SELECT DISTINCT user_id::BIGINT AS user_id FROM read_csv('{files.user_features}',
                         header = true, all_varchar = true))
            SELECT user_id, video_id, action, time_ms FROM ev JOIN kept USING (user_id) JOIN featured USING (user_id)
            ORDER BY user_id, time_ms, file, row
        ) TO '{out}' (FORMAT parquet);
    """


def run_duckdb(sql_of, raw: Path, out: Path, memory_gb: float) -> None:
    """One statement of `sql_of` over the raw folder's standard logs, spilling beside `out`."""
    import duckdb as db

    from hstu_replay.data.bounded import find_raw_files

    work = out.with_suffix(".spill")
    work.mkdir(parents=True, exist_ok=True)
    db.connect().execute(sql_of(find_raw_files(raw, include_random=False), out, memory_gb, work))


def duckdb(raw: Path, out: Path, memory_gb: float) -> None:
    run_duckdb(duckdb_sql, raw, out, memory_gb)


def duckdb_flat(raw: Path, out: Path, memory_gb: float) -> None:
    run_duckdb(duckdb_flat_sql, raw, out, memory_gb)


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


def pandas(raw: Path, out: Path, memory_gb: float) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    del memory_gb
    frame = pandas_prepare(raw)
    table = pa.table({"user_id": frame["user_id"], "video_ids": frame["video_id"], "actions": frame["action_weights"],
                      "times_ms": frame["time_ms"], **{f"k{i}": frame[k] for i, k in enumerate(CONTEXT_KEYS)}})
    pq.write_table(table, out)


#: name -> (worker, its output: a store, a Parquet file of per-user lists or of sorted event rows, what it is)
KINDS = {
    "read": (read_only, None, "reading the CSVs only (pyarrow.csv.read_csv, the columns used, file by file): the reference"),
    "ours": (ours, "store", "hstu-replay data prepare (bounded: held while one sorting group holds it, else spilled by user range; sorted per group)"),
    "in-memory": (in_memory, "store", "the in-memory path (1K names only): one table, one stable argsort"),
    "duckdb": (duckdb, "parquet", "DuckDB, NVIDIA's recipe in SQL (lists ordered by time, file, row)"),
    "duckdb-flat": (duckdb_flat, "rows", "DuckDB, the same events as one sorted table (no lists)"),
    "pandas": (pandas, "parquet", "pandas, NVIDIA's recipe (read_csv, groupby->list, merge, stable sort)"),
}


def worker(kind: str, raw: Path, out: Path, memory_gb: float) -> None:
    """Child process: run one implementation, print {"seconds", "peak_rss_mb"} as the last line."""
    start = time.perf_counter()
    extra = KINDS[kind][0](raw, out, memory_gb) or {}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({**extra, "seconds": seconds, "peak_rss_mb": peak}))


# --- comparing outputs ------------------------------------------------------------------------------


def store_arrays(path: Path) -> dict[str, np.ndarray]:
    from hstu_replay.data.store import SequenceStore

    store = SequenceStore.open(path)
    return {"user_ids": store.user_ids, "offsets": store.offsets, "video_ids": store.video_ids,
            "actions": store.actions, "times_ms": store.times_ms, "context": store.context}


def parquet_arrays(path: Path) -> dict[str, np.ndarray]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    lists = table.column("video_ids").combine_chunks()
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    flat = lambda name: pc.list_flatten(table.column(name).combine_chunks()).to_numpy()  # noqa: E731
    return {"user_ids": table.column("user_id").to_numpy(), "offsets": np.concatenate([[0], np.cumsum(lengths)]),
            "video_ids": flat("video_ids"), "actions": flat("actions"), "times_ms": flat("times_ms"),
            "context": np.stack([table.column(f"k{i}").to_numpy() for i in range(len(CONTEXT_KEYS))], axis=1)}


def row_arrays(path: Path) -> dict[str, np.ndarray]:
    """A sorted event table's columns as the store's arrays (no user context in it)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    users = table.column("user_id").to_numpy()
    starts = np.flatnonzero(np.diff(users, prepend=users[:1] - 1)) if users.size else np.zeros(0, np.int64)
    return {"user_ids": users[starts], "offsets": np.append(starts, users.size), "video_ids": table.column("video_id").to_numpy(),
            "actions": table.column("action").to_numpy(), "times_ms": table.column("time_ms").to_numpy()}


def differences(reference: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> list[str]:
    return [name for name, array in reference.items() if name in other and not np.array_equal(array, other[name])]


# --- the run --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", type=Path, help="existing raw folder (default: synthesize one)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "prepare-bench")
    parser.add_argument("--release", choices=tuple(schema.RELEASES), default=schema.DEFAULT_RELEASE)
    parser.add_argument("--users", type=int, default=schema.RELEASES[schema.DEFAULT_RELEASE].users)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-gb", type=float, default=DEFAULT_MEMORY_GB,
                        help="ours' --memory-gb and DuckDB's memory_limit")
    parser.add_argument("--duckdb-memory-gb", type=float,
                        help="DuckDB's memory_limit when not --memory-gb (its own default is 80%% of RAM)")
    parser.add_argument("--kinds", default="read,ours,in-memory,duckdb",
                        help=f"comma-separated, of {', '.join(KINDS)} (pandas: 1K size at most, it holds "
                             "Python lists of every event)")
    parser.add_argument("--no-compare", action="store_true", help="skip the array-by-array comparison")
    parser.add_argument("--worker", choices=tuple(KINDS), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.raw, args.out, args.memory_gb)
        return 0

    args.work.mkdir(parents=True, exist_ok=True)
    raw = args.raw
    if raw is None:
        from hstu_replay.data.synth import synthesize

        raw = args.work / f"raw-{args.release}-u{args.users}-x{args.scale:g}-s{args.seed}"
        if not (raw / schema.RELEASES[args.release].user_features).is_file():
            start = time.perf_counter()
            report = synthesize(raw, args.users, args.seed, args.scale, args.release)
            print(f"{report.line()} in {time.perf_counter() - start:.1f} s")
    from hstu_replay.data.bounded import find_raw_files

    files = find_raw_files(raw, include_random=False)
    megabytes = sum(path.stat().st_size for _, path in files.logs) / 1e6
    print(f"raw: {raw} ({files.release.name} names, {len(files.logs)} standard log files, {megabytes:,.0f} MB)")

    kinds = [k for k in args.kinds.split(",") if k]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise SystemExit(f"unknown --kinds {', '.join(unknown)}")
    if files.release.name != schema.DEFAULT_RELEASE:
        kinds = [k for k in kinds if k not in ("in-memory", "pandas")]  # they read the 1K names only
    results, outputs, failures = {}, {}, {}
    for kind in kinds:
        output = KINDS[kind][1]
        out = args.work / (f"{kind}-store" if output == "store" else f"{kind}.parquet")
        command = [sys.executable, "-m", "bench.prepare_bench", "--worker", kind, "--raw", str(raw),
                   "--out", str(out), "--memory-gb", str(args.memory_gb)]
        if kind.startswith("duckdb") and args.duckdb_memory_gb is not None:
            command[-1] = str(args.duckdb_memory_gb)
        try:
            results[kind] = measured_child(command, args.work / f"{kind}.log")
        except SystemExit as failed:  # one implementation failing (DuckDB out of memory) is a figure too
            failures[kind] = str(failed)
            continue
        if kind == "read":
            rows = results[kind]["rows"]
        if output:
            outputs[kind] = (output, out)
    reference = results.get("read", results[kinds[0]])
    rows_out = [[kind, f"{r['seconds']:.1f}", f"{r['seconds'] / reference['seconds']:.2f}", f"{r['peak_rss_mb']:,.0f}",
                 KINDS[kind][2]] for kind, r in results.items()]
    print()
    print(f"`{this_command()}`" + (f" ({rows:,} standard-log rows)" if "read" in results else ""))
    print()
    print(table(["implementation", "seconds", "x read", "peak RSS MB", "what"], rows_out))
    for kind, failure in failures.items():
        print(f"\n{kind} FAILED: {failure}")
    if "ours" in results and "duckdb" in results:
        print(f"\nDuckDB / ours: {results['duckdb']['seconds'] / results['ours']['seconds']:.2f}x the time, "
              f"{results['duckdb']['peak_rss_mb'] / results['ours']['peak_rss_mb']:.2f}x the peak RSS")
    if args.no_compare or "ours" not in outputs:
        return 0
    mine = store_arrays(outputs["ours"][1])
    mismatched = False
    for kind, (output, path) in outputs.items():
        if kind == "ours":
            continue
        theirs = {"store": store_arrays, "parquet": parquet_arrays, "rows": row_arrays}[output](path)
        different = differences(mine, theirs)
        mismatched |= bool(different)
        print(f"{kind}: " + (f"MISMATCH in {', '.join(different)}" if different else "identical to ours, array by array"))
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
