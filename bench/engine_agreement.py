"""Do the batched engine (paged pool, Triton kernel on a GPU) and the per-user eager engine agree?

    python bench/engine_agreement.py --config kuairand-1k --device cuda --history 4096 --candidates 100

One request of `--batch` users with mixed cache states (cold, partly and fully cached) goes to
both engines with the same weights; prints the largest logit difference in float32 and, against
the float32 eager answer, in bfloat16. Exit 1 when a difference exceeds its tolerance.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hstu_replay.request import UserRequest, build_request  # noqa: E402
from hstu_replay.server.batched import build_batched_engine  # noqa: E402
from hstu_replay.server.config import get_config  # noqa: E402
from hstu_replay.server.engine import RankingEngine  # noqa: E402
from hstu_replay.server.kvcache import KVCache  # noqa: E402
from hstu_replay.server.model import EagerCompute, build_model  # noqa: E402
from target_latency_bench import LIMITS  # noqa: E402  (this folder is on sys.path)

TOLERANCE = {"float32": 1e-3, "bfloat16": 0.0625}  # the bf16 one: NVIDIA's dump tolerance


def users(rng: np.random.Generator, batch: int, history: int, candidates: int) -> list[UserRequest]:
    return [UserRequest(int(rng.integers(1, 1 << 30)), tuple(int(x) for x in rng.integers(1, 16, 5)),
                        rng.integers(1, 1 << 40, history, dtype=np.int64), rng.integers(0, 256, history, dtype=np.int64),
                        rng.integers(1, 1 << 40, candidates, dtype=np.int64), cache_key=key)
            for key in range(batch)]


def primes(full: list[UserRequest]) -> list[UserRequest]:
    """Prefixes of increasing length (user 0 none: cold; the last: everything)."""
    out = []
    for i, u in enumerate(full[1:], 1):
        n = len(u.history_items) * i // (len(full) - 1)
        out.append(replace(u, history_items=u.history_items[:n], history_actions=u.history_actions[:n]))
    return out


def answer(engine, full: list[UserRequest]) -> tuple[np.ndarray, list[int]]:
    warm = primes(full)
    if warm:
        engine.infer(build_request(warm, LIMITS))
    result = engine.infer(build_request(full, LIMITS))
    return result.logits, result.cached_tokens.tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--history", type=int, default=250)
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    full = users(np.random.default_rng(0), args.batch, args.history, args.candidates)
    base = get_config(args.config)
    eager = RankingEngine(base, EagerCompute(build_model(base).to(args.device)), KVCache(None), args.device)
    expected, cached = answer(eager, full)
    ok = True
    for dtype in ("float32", "bfloat16"):
        model = build_model(get_config(args.config, dtype)).to(args.device)
        got, got_cached = answer(build_batched_engine(model, 1 << 20, 32), full)
        diff = float(np.abs(got - expected).max())
        good = diff <= TOLERANCE[dtype] and got_cached == cached
        ok &= good
        print(f"{args.config} on {args.device}, {args.batch} users x {args.history} items + {args.candidates} "
              f"candidates, cached tokens {got_cached}: batched {dtype} vs eager float32: max |diff| {diff:.3g} "
              f"(tolerance {TOLERANCE[dtype]:g}) {'ok' if good else 'MISMATCH'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
