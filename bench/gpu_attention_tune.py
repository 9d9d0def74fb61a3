"""The attention kernel's launch (tiles, warps, stages, SiLU, split) on NVIDIA's protocol shapes, and its share of a step.

    python -m bench.gpu_attention_tune --out OUT [--config kuairand-1k] [--history 4096] [--candidates 100]
        [--package REPOSITORY] [--default-launch]

On a GPU, bf16: 8 users of `--history` items (6 + 2 x history tokens) and `--candidates` each, as
the protocol's batch of 8 sends them: cold (nothing cached: every history token a query) and fully
cached (the candidates against the pooled keys). For each `KernelLaunch` in the grid (and, fully
cached, each split of the keys: `min_programs`; cold, the kernel's split mode on the unsplit plan,
as a compiled step runs it): the kernel's time (triton.testing.do_bench,
median), its useful TFLOP/s (the rows x keys each item really visits), and the largest difference
of its output from the default launch's (every launch must give the same sums, within what a
16-bit SiLU changes); `--default-launch`: `LAUNCH` alone. Then the batched engine's whole step on
the same shapes (`BatchedEngine.step`, `--config`'s layers): eager, and with `--package` the
batched-aoti package compiled into that repository (compiled there first when missing), what the
C++ backend runs, with the largest difference of its logits from eager's on the same seeded pool
and tokens; and where each step's GPU time goes (torch.profiler: kernels by name, ms per step).
Prints a table per shape and writes attention_tune.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from bench.harness import table, this_command
from hstu_replay.server.model_config import get_config
from hstu_replay.server.paged_attention import (LAUNCH, MIN_PROGRAMS, SILU_TANH_BF16X2, KernelLaunch, WorkPlan,
                                                paged_attention)

PAGE_TOKENS = 32
BATCH = 8
# each the same tiles for whole items and chunks (LAUNCH: the chunks of a split on tiles of their own)
GRID = [LAUNCH] + [KernelLaunch.uniform(m, n, w, s) for m, n, w, s in [
    (128, 64, 4, 3), (128, 128, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3),
    (128, 128, 4, 2),
    # smaller key blocks, for the fully cached shape (call 21's best there: 128 x 32, 0.117 ms against 0.150)
    (128, 32, 4, 2), (128, 32, 8, 3), (64, 32, 4, 3),
    # 8 warps on the default tiles: no spills in the key loop where 4 warps spill (ptxas for sm_90a)
    (128, 64, 8, 3), (128, 64, 8, 2)]]
#: the default launch with SiLU as one tanh for two 16-bit values
LAUNCH_BF16X2 = replace(LAUNCH, silu=SILU_TANH_BF16X2)
GRID += [LAUNCH_BF16X2, KernelLaunch.uniform(128, 128, 4, 2, SILU_TANH_BF16X2),
         KernelLaunch.uniform(64, 64, 4, 4, SILU_TANH_BF16X2)]
#: fully cached only: how many programs the keys are split to reach (the plan's `min_programs`)
SPLITS = [132, 264, 1024, 2048]
TOP_KERNELS = 14


def case(past: int, n_hist: int, n_cand: int, heads: int, head_dim: int, device, rng) -> dict:
    """Random q/k/v, views of one projection as a step passes them, and a pool holding every user's
    `past + n_hist` keys, pages shuffled."""
    kv = past + n_hist
    pages_each = -(-kv // PAGE_TOKENS)
    order = torch.from_numpy(rng.permutation(BATCH * pages_each)).to(device)
    page_table = order.view(BATCH, pages_each).to(torch.int64)
    slots = BATCH * pages_each * PAGE_TOKENS
    tokens = BATCH * (n_hist + n_cand)

    def normal(*shape):
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    _, v, q, k = normal(tokens, 4, heads, head_dim).unbind(1)  # the layer's u, v, q, k projection
    return dict(q=q, k=k, v=v, pool_k=normal(slots, heads, head_dim), pool_v=normal(slots, heads, head_dim),
                page_table=page_table, lengths=(np.full(BATCH, past), np.full(BATCH, n_hist), np.full(BATCH, n_cand)))


def useful_flops(items: np.ndarray, heads: int, head_dim: int) -> float:
    """q.k and w.v over the keys each item visits (2 matmuls, 2 flops a multiply-add)."""
    rows, keys = items[:, 2].astype(np.float64), (items[:, 6] - items[:, 5]).astype(np.float64)
    return float((rows * keys).sum()) * heads * head_dim * 4


def time_launch(launch: KernelLaunch, data: dict, heads: int, normaliser: float, head_dim: int,
                min_programs: int = MIN_PROGRAMS, split_mode: bool = False):
    """The kernel on `data` with a plan split to `min_programs`; `split_mode`: the kernel's split mode
    whatever the plan, as a compiled step runs it (the split's four launches: zero, whole items, chunks, finish)."""
    import triton.testing

    plan = WorkPlan.plan(*data["lengths"], heads, block_m=launch.block_m, block_n=launch.block_n,
                         min_programs=min_programs, chunk_block_m=launch.chunk_block_m)
    items = torch.from_numpy(plan.items).to(data["q"].device)

    def call():
        return paged_attention(data["q"], data["k"], data["v"], data["pool_k"], data["pool_v"], data["page_table"],
                               plan.split or split_mode, items, PAGE_TOKENS, normaliser, launch)

    out = call()
    ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
    return ms, useful_flops(plan.items, heads, head_dim) / ms / 1e9, out.float()


class StepCase:
    """The batched engine's whole forward pass on one shape, eager or through a package's
    `forward_step`, with device inputs laid out as the engine lays them out."""

    def __init__(self, config, data: dict, device, forward_step=None) -> None:
        from hstu_replay.server.batched import build_batched_engine
        from hstu_replay.server.model import build_model
        from hstu_replay.server.step_graphs import StepInputs

        model = build_model(config, 0).to(device=device, dtype=getattr(torch, config.dtype))
        past, n_hist, n_cand = data["lengths"]
        budget = int(BATCH * (past[0] + n_hist[0])) + 1024
        self.engine = build_batched_engine(model, budget, PAGE_TOKENS, forward_step=forward_step)
        gen = torch.Generator(device=device).manual_seed(0)  # the same pool and tokens for every StepCase
        for pool in (self.engine.cache.pool_k, self.engine.cache.pool_v):  # a fully cached step's keys
            pool.copy_(torch.randn(pool.shape, generator=gen, device=device, dtype=pool.dtype))
        self.plan = WorkPlan.plan(past, n_hist, n_cand, config.num_heads)
        tokens = int((n_hist + n_cand).sum())
        pages_each = data["page_table"].shape[1]
        table = torch.arange(BATCH * pages_each, device=device).view(BATCH, pages_each)
        hist_pos = torch.cat([torch.arange(int(past[u]), int(past[u] + n_hist[u])) for u in range(BATCH)]).to(device)
        owner = torch.arange(BATCH, device=device).repeat_interleave(int(n_hist[0]))
        self.slots = table[owner, hist_pos // PAGE_TOKENS] * PAGE_TOKENS + hist_pos % PAGE_TOKENS
        ids = torch.randint(1, 1000, (tokens,), device=device, generator=gen)
        kinds = torch.full((tokens,), 6, device=device)
        positions = torch.cat([hist_pos, torch.full((tokens - len(hist_pos),), int(past[0] + n_hist[0]),
                                                    device=device)])
        # the engine hands every index over as int64 (one packed copy): the package is compiled for that
        items = torch.from_numpy(self.plan.items.astype(np.int64)).to(device)
        self.inputs = StepInputs(ids, kinds, positions, table, items)

    def run(self) -> Tensor:
        """The step's logits (float32, on the device)."""
        return self.engine.step(self.inputs, self.plan.split, self.slots)

    def time(self, calls: int = 25, warm: int = 5) -> float:
        """ms per step (CUDA events, median of the calls after `warm`)."""
        times = []
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return float(np.median(times[warm:]))

    def kernels(self, steps: int = 5) -> list[dict]:
        """The step's GPU time by kernel name (torch.profiler), ms per step, largest first."""
        from torch.profiler import ProfilerActivity, profile

        self.run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                self.run()
            torch.cuda.synchronize()
        totals: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                entry = totals.setdefault(event.name, [0.0, 0])
                entry[0] += event.device_time_total / 1e3
                entry[1] += 1
        gpu = sum(t for t, _ in totals.values()) / steps
        rows = [{"kernel": name[:90], "ms": t / steps, "share": t / steps / gpu if gpu else 0.0, "calls": n // steps}
                for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])]
        return [{"kernel": "(all kernels)", "ms": gpu, "share": 1.0, "calls": sum(r["calls"] for r in rows)}] + rows


def package_step(repository: Path, config):
    """The batched-aoti package of `config` in `repository` (compiled there first when missing)."""
    from hstu_replay.server.aoti import load_batched_step
    from hstu_replay.server.build import batched_step_path, prepare_engine

    prepare_engine("batched-aoti", repository, config, 0, PAGE_TOKENS, "cuda")
    return load_batched_step(batched_step_path(repository, config, 0, PAGE_TOKENS, "cuda"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default="kuairand-1k")
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--package", type=Path, default=None,
                        help="a repository: time the batched-aoti package compiled there too")
    parser.add_argument("--default-launch", action="store_true",
                        help="time LAUNCH alone (cold: also in the split mode), not the grid")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_attention_tune: needs a GPU", file=sys.stderr)
        return 2
    config, device, rng = get_config(args.config, "bfloat16"), torch.device("cuda"), np.random.default_rng(0)
    tokens = 6 + 2 * args.history
    shapes = {"cold": (0, tokens, args.candidates), "fully cached": (tokens, 0, args.candidates)}
    result = {"command": this_command(), "device": torch.cuda.get_device_name(), "shapes": {}}
    steps = {"eager": None} | ({"package": package_step(args.package, config)} if args.package else {})
    for name, (past, n_hist, n_cand) in shapes.items():
        data = case(past, n_hist, n_cand, config.num_heads, config.head_dim, device, rng)
        rows, reference = [], None
        variants = [(g, MIN_PROGRAMS, False) for g in ([LAUNCH] if args.default_launch else GRID)]
        if name == "fully cached":
            variants += [] if args.default_launch else [(g, m, False) for m in SPLITS for g in (LAUNCH, LAUNCH_BF16X2)]
        else:  # cold, the plan is not split: also the split mode on it, as a compiled step runs the kernel
            variants.append((LAUNCH, MIN_PROGRAMS, True))
        for launch, min_programs, split_mode in variants:
            row = {**asdict(launch), "min_programs": min_programs, "split_mode": split_mode}
            try:
                ms, tflops, out = time_launch(launch, data, config.num_heads, config.attn_normaliser, config.head_dim,
                                              min_programs, split_mode)
            except Exception as exc:  # a launch the compiler or the device refuses (shared memory, registers)
                rows.append({**row, "error": str(exc).splitlines()[0][:160]})
                continue
            reference = out if reference is None else reference
            rows.append({**row, "ms": ms, "tflops": tflops, "max_diff": float((out - reference).abs().max())})
        timed, breakdown, logits = {}, {}, {}
        for label, forward_step in steps.items():
            try:
                step = StepCase(config, data, device, forward_step)
                logits[label] = step.run().float()
                timed[label] = f"{step.time():.3f} ms"
                breakdown[label] = step.kernels()
            except Exception as exc:  # the table above still stands
                timed[label] = f"failed: {str(exc).splitlines()[0][:160]}"
        if len(logits) == 2:  # the package (kernel in its split mode) against eager (split by plan)
            diff = float((logits["package"] - logits["eager"]).abs().max())
            timed["package vs eager, max |logit diff|"] = f"{diff:.4g}"
        result["shapes"][name] = {"launches": rows, "steps": timed, "kernels": breakdown, "layers": config.num_layers}
        print(f"== {name}: {BATCH} users, past {past}, new history {n_hist}, candidates {n_cand}; "
              f"step ({config.num_layers} layers, default launch): {timed}")
        print(table(["block_m", "block_n", "warps", "stages", "chunks: block_m/warps/stages", "silu", "min programs",
                     "split mode", "ms", "TFLOP/s", "max diff", "error"],
                    [[r["block_m"], r["block_n"], r["num_warps"], r["num_stages"],
                      f"{r['chunk_block_m']}/{r['chunk_warps']}/{r['chunk_stages']}", r["silu"], r["min_programs"],
                      "always" if r["split_mode"] else "by plan", r.get("ms", ""), r.get("tflops", ""),
                      r.get("max_diff", ""), r.get("error", "")] for r in rows]))
        for label, kernels in breakdown.items():
            print(f"-- where the {label} step's GPU time goes (ms per step)")
            print(table(["kernel", "ms", "share", "calls"],
                        [[r["kernel"], r["ms"], f"{r['share']:.1%}", r["calls"]] for r in kernels[:TOP_KERNELS]]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_tune.json").write_text(json.dumps(result, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())
