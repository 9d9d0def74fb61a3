"""How far the reference model's answers move when part of a history is wrong, against bf16 rounding.

    python -m bench.model_sensitivity --configs small:120 kuairand-1k:300,1000,4000 kuairand-1k-8l:300 --gains 1,1 2,6

For each config, history length (items) and pair of gains on the query/key and output projections
(`server.model.QK_GAIN`, `OUT_GAIN`; 1,1 is PyTorch's default initialisation), over `--pairs` pairs of
random histories of the same user and context, the max |logit difference| for the same 16 candidates
when the history is replaced by another one of the same length, when only its first half is (what a
stale cache would hold), when its items come in another order, when 32 tokens in its middle are; the
smallest over the pairs, the cases a check must catch. Beside them the largest difference of the same
model in bf16 from float32 (what the check must let pass), and NVIDIA's tolerance.
"""

from __future__ import annotations

import argparse

import torch

from bench.harness import table, this_command
from hstu_replay.server import model as reference
from hstu_replay.server.model import EagerCompute, build_model
from hstu_replay.server.model_config import DTYPES, get_config
from hstu_replay.verify import DEFAULT_TOLERANCE

CANDIDATES = 16


def _built(name: str, dtype: str, qk_gain: float, out_gain: float) -> EagerCompute:
    """The seed-0 model with its gains replaced by these (the weights rescaled, then cast)."""
    model = build_model(get_config(name), seed=0)
    for layer in model.layers:
        layer.scale(qk_gain / reference.QK_GAIN, out_gain / reference.OUT_GAIN)
    return EagerCompute(model.to(getattr(torch, dtype)))


def _moved(name: str, items: int, pairs: int, gains: tuple[float, float]) -> list:
    config = get_config(name)
    exact, rounded = (_built(name, dtype, *gains) for dtype in DTYPES)
    moved = {"another": [], "stale half": [], "shuffled": [], "32 tokens": [], "bf16": []}
    for seed in range(pairs):
        gen = torch.Generator().manual_seed(seed)
        mine, other = (torch.randint(0, 1 << 40, (6 + 2 * items,), generator=gen) for _ in range(2))
        other[:6] = mine[:6]  # the same user and context
        cands = torch.randint(0, 1 << 40, (CANDIDATES,), generator=gen)
        middle = len(mine) // 2
        patched = mine.clone()
        patched[middle:middle + 32] = other[middle:middle + 32]
        shuffled = torch.cat([mine[:6], mine[6:].view(items, 2)[torch.randperm(items, generator=gen)].flatten()])

        def answer(compute: EagerCompute, hist: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            empty = torch.zeros(config.num_layers, 0, config.num_heads, config.head_dim, dtype=dtype)
            return compute(hist, cands, empty, empty)[0]

        right = answer(exact, mine)
        cases = {"another": answer(exact, other),
                 "stale half": answer(exact, torch.cat([other[:middle], mine[middle:]])),
                 "shuffled": answer(exact, shuffled), "32 tokens": answer(exact, patched),
                 "bf16": answer(rounded, mine, torch.bfloat16)}
        for case, logits in cases.items():
            moved[case].append(float((logits - right).abs().max()))
    return [name, items, f"{gains[0]:g}, {gains[1]:g}", min(moved["another"]), min(moved["stale half"]),
            min(moved["shuffled"]), min(moved["32 tokens"]), max(moved["bf16"]), f"{DEFAULT_TOLERANCE:g}"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["small:120", "kuairand-1k:300,1000,4000"],
                        help="CONFIG:ITEMS[,ITEMS...] (history lengths in items)")
    parser.add_argument("--gains", nargs="+", default=[f"{reference.QK_GAIN:g},{reference.OUT_GAIN:g}"],
                        help="QK,OUT pairs of gains to compare")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of histories per row")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.configs:
        name, lengths = spec.split(":")
        for items in (int(n) for n in lengths.split(",")):
            for gains in args.gains:
                qk, out = (float(g) for g in gains.split(","))
                rows.append(_moved(name, items, args.pairs, (qk, out)))
                print(rows[-1], flush=True)
    print(this_command())
    print(table(["config", "items", "gains (qk, out)", "another history", "stale first half", "shuffled",
                 "32 tokens", "bf16 rounding", "tolerance"], rows))


if __name__ == "__main__":
    main()
