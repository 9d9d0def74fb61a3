"""Where the batched engine's time goes on a GPU: torch profiler tables of one cold and one fully cached request.

    python bench/profile_batched.py --config kuairand-1k --batch 8 --history 4096 --candidates 100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_agreement import users  # noqa: E402  (this folder is on sys.path)
from target_latency_bench import LIMITS  # noqa: E402
from hstu_replay.request import build_request  # noqa: E402
from hstu_replay.server.batched import build_batched_engine  # noqa: E402
from hstu_replay.server.config import get_config  # noqa: E402
from hstu_replay.server.model import build_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="kuairand-1k")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--rows", type=int, default=12, help="table rows")
    args = parser.parse_args()
    model = build_model(get_config(args.config, args.dtype)).to("cuda")
    engine = build_batched_engine(model, 1 << 20, 32)
    rng = np.random.default_rng(0)
    for _ in range(3):  # compile the kernel, warm the allocator
        engine.infer(build_request(users(rng, args.batch, args.history, args.candidates), LIMITS))
    engine.clear_cache()
    request = build_request(users(rng, args.batch, args.history, args.candidates), LIMITS)
    from torch.profiler import ProfilerActivity, profile

    for title in ("cold (0% cached)", "fully cached (100%)"):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            engine.infer(request)
            wall = (time.perf_counter() - started) * 1e3
        print(f"### {args.config} {args.dtype}, batch {args.batch}: {title}: {wall:.2f} ms wall")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows))
    # the host side of a fully cached request: where Python spends its time
    import cProfile
    import pstats

    walls = []
    profiler = cProfile.Profile()
    for _ in range(20):
        started = time.perf_counter()
        profiler.runcall(engine.infer, request)
        walls.append((time.perf_counter() - started) * 1e3)
    print(f"### host profile, 20 fully cached requests: median {np.median(walls):.2f} ms wall (under cProfile)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(args.rows * 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
