"""How many CPU threads the reference model computes with.

Beside other work (tritonserver's own threads, a load generator on the same machine, a
neighbour), a model using every core makes its OpenMP threads wait on each other: measured on 2
cores, one process spinning on one core took the small model's cold batch-8 p50 from 73-78 ms to
250-264 ms with 2 threads, and to 89 ms with 1 (BENCHMARKS.md). The default leaves one core.
"""

from __future__ import annotations

import os


def model_threads(requested: int = 0) -> int:
    """`requested` if positive; else OMP_NUM_THREADS where the user set it; else the usable
    cores minus one (at least one)."""
    if requested > 0:
        return requested
    from_env = os.environ.get("OMP_NUM_THREADS", "")
    if from_env.isdigit() and int(from_env) > 0:
        return int(from_env)
    return max(1, len(os.sched_getaffinity(0)) - 1)


def apply_threads(requested: int = 0) -> int:
    """Set the model's threads; call before torch is first imported (OpenMP reads its
    environment once). Returns the number set."""
    threads = model_threads(requested)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    return threads
