"""Working-set sweep against the reference target: latency and tier mix as the distinct users grow
past the GPU pool, then past the host pool.

    python -m bench.working_set                                   # small config on this CPU
    python -m bench.working_set --sizes 2,4,8,12,16,24 --seconds 10

The reference target (`server serve`, the small config, batched engine, CPU) runs with a GPU
(primary) pool of `--gpu-keys` and a host pool of `--host-keys` users of `--max-history` items
(flexkv offload: the host holds copies of the GPU's users too). For each working-set size N, one
headless Locust run of the sessions workload with `--working-set N --hit-ratios 1`, batch 1, one
user: N keys revisited round-robin, so every LRU pool sees a reuse distance of N. Per N: the tier
mix the server reported (HOST_CACHED_TOKENS), what the client's model expected, by hand (GPU hits
while N*T fits the GPU pool, host hits while it fits the host pool, misses beyond), and latency
p50/p99 per logical request, with the ratio to the smallest N's p50 (same invocation).
Prints a markdown table, the command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench import harness
from bench.harness import ROOT
from hstu_replay.cache_ledger import pages
from hstu_replay.interface import history_tokens
from hstu_replay.loadtest.command import headless_command
from hstu_replay.process import ServerProcess

OUT = ROOT / "runs" / "working-set"
PAGE = 32


def hand_worked(size: int, key_tokens: int, gpu: int, host: int) -> str:
    return "gpu" if size * key_tokens <= gpu else "host" if size * key_tokens <= host else "miss"


def sweep_one(server: ServerProcess, size: int, args) -> dict:
    report = OUT / f"report-{size}"
    command = headless_command(report, "-u", "1", "-r", "1", "-t", f"{int(args.seconds + args.warmup) + 60}s",
                               "--triton-url", server.grpc_url, "--workload", "sessions", "--store", str(args.store),
                               "--hit-ratios", "1", "--batch-sizes", "1", "--max-history", str(args.max_history),
                               "--stage-seconds", str(args.seconds), "--warmup-seconds", str(args.warmup),
                               "--offload-mode", "flexkv", "--working-set", str(size))
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=args.seconds + args.warmup + 120)
    if done.returncode != 0:
        raise SystemExit(f"working_set: the run at N={size} failed ({done.returncode}): {done.stderr[-2000:]}")
    data = json.loads((report / "report.json").read_text())
    stage, b = data["stages"][0], data["bins"][0]
    return {"size": size, "tiers": stage["tiers"], "p50": b["p50_ms"] / stage["batch_size"],
            "p99": b["p99_ms"] / stage["batch_size"], "requests": stage["requests"],
            "disagreements": stage["hit_disagreements"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,6,8,12,16,24", help="working-set sizes N (keys)")
    parser.add_argument("--gpu-keys", type=int, default=4, help="GPU (primary) pool, in users of --max-history")
    parser.add_argument("--host-keys", type=int, default=12, help="host pool, in users of --max-history")
    parser.add_argument("--max-history", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--store", default=str(OUT / "store"), help="a prepared store (default: the sample, prepared)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if not sizes or min(sizes) < 1 or args.gpu_keys < 1 or args.host_keys <= args.gpu_keys:
        raise SystemExit("working_set: --sizes of 1 or more keys, --host-keys above --gpu-keys >= 1")
    OUT.mkdir(parents=True, exist_ok=True)
    if args.store == str(OUT / "store") and not (OUT / "store").exists():
        from hstu_replay.data.prepare import prepare

        prepare(ROOT / "datasets" / "sample", OUT / "store")
    from hstu_replay.server.build import export_repository

    export_repository(OUT / "repository", "small", seed=0, device="cpu")
    key_tokens = pages(history_tokens(args.max_history), PAGE) * PAGE
    gpu, host = args.gpu_keys * key_tokens, args.host_keys * key_tokens
    load_before = harness.machine_load()
    server = ServerProcess.serve(OUT / "repository", OUT / "server.log", None, "--device", "cpu", "--engine", "batched",
                                 "--cache-budget-tokens", str(gpu), "--host-budget-tokens", str(host),
                                 "--offload-mode", "flexkv", "--threads", "1", cwd=ROOT).launch()
    try:
        results = [sweep_one(server, n, args) for n in sizes]
    finally:
        server.stop()
    base = results[0]["p50"]
    rows = []
    for r in results:
        t = r["tiers"]
        rows.append([r["size"], r["size"] * key_tokens, hand_worked(r["size"], key_tokens, gpu, host),
                     *(f"{t['mix'][k]:.3f}" for k in ("gpu", "host", "miss")), t["source"],
                     f"{t['gpu_ratio']:.3f}", f"{t['host_ratio']:.3f}", r["disagreements"], r["requests"],
                     f"{r['p50']:.2f}", f"{r['p99']:.2f}", f"{r['p50'] / base:.2f}"])
    print(f"GPU pool {gpu:,} tokens ({args.gpu_keys} users), host pool {host:,} tokens ({args.host_keys} users), "
          f"T = {key_tokens} tokens per user (--max-history {args.max_history}, whole pages of {PAGE})")
    print(harness.table(["N", "N*T", "by hand", "mix gpu", "mix host", "mix miss", "from", "gpu hit ratio",
                         "host hit ratio", "model disagreed", "requests", "p50 ms/logical", "p99 ms/logical",
                         f"p50 / N={sizes[0]}"], rows))
    print(f"\n{harness.this_command()}\nload before: {load_before}; after: {harness.machine_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
