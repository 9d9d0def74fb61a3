"""The reference target beside other work: p50 at 0% hits, quiet and with a process spinning on one core.

    python bench/target_contention.py                    # small config, batch 8, threads: auto and 2
    python bench/target_contention.py --threads 0,1,2 --repeats 40

For each thread setting of `server serve` (0: its default policy), one server is started; the
same cold requests (batch 8, fresh keys, no prime) are timed quietly, then again while one other
process spins on a core, in the same invocation; the ratio of the two p50s is what the thread
policy must keep low (goal: within 1.6x). The server and request harness are
bench/target_latency_bench.py's.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import target_latency_bench as harness  # noqa: E402

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def p50_cold(settings: harness.Settings, grpc_port: int) -> float:
    """p50 ms of `settings.repeats` cold batch-8 requests through the server on `grpc_port`."""
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        harness.FRACTIONS = (0.0,)  # cold requests only
        cells = harness.measure(lambda t: harness.triton_infer(client, t), lambda: harness.triton_clear(client),
                                settings)
    finally:
        client.close()
    (cell,) = cells.values()
    return float(np.percentile(cell.latencies_ms, 50))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=harness.ROOT / "runs" / "model_repository")
    parser.add_argument("--threads", default="0,2", help="server serve --threads values (0: its default)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    base = harness.Settings(args.repository, "aoti", "small", None, "cpu", history=256, candidates=32,
                            cache_budget_tokens=3_276_800, batches=[args.batch], repeats=args.repeats,
                            budget_s=120.0, threads=0, seed=0)
    from hstu_replay.server.build import export_repository

    export_repository(args.repository, "small", 0, "cpu")
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        server = harness.start_server(base, extra=["--threads", str(threads)])
        try:
            quiet = p50_cold(base, server.grpc_port)
            spinner = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=600)])
            try:
                time.sleep(1.0)
                busy = p50_cold(replace(base, seed=1), server.grpc_port)
            finally:
                spinner.kill()
                spinner.wait(10)
        finally:
            harness.stop_server(server)
        rows.append((threads or "default", quiet, busy, busy / quiet))
        print(f"threads {rows[-1][0]}: quiet p50 {quiet:.1f} ms, beside a spinning process {busy:.1f} ms "
              f"({busy / quiet:.2f}x)", flush=True)
    print()
    print("| `--threads` | quiet p50 ms | beside one spinning process | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for threads, quiet, busy, ratio in rows:
        print(f"| {threads} | {quiet:.1f} | {busy:.1f} | {ratio:.2f}x |")
    print()
    print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
