"""Paged HSTU attention: the work plan, the plain-PyTorch twin against first principles, the Triton kernel."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hstu_replay.server.paged_attention import (BLOCK_M, LAUNCH, MIN_PROGRAMS, WorkPlan, paged_attention,
                                                reference_attention)

ROOT = Path(__file__).resolve().parents[2]
HEADS, DIM = 2, 32


@dataclass
class Case:
    """A jagged batch: user b has past[b] cached tokens, n_hist[b] new history tokens, n_cand[b] candidates."""

    past: np.ndarray
    n_hist: np.ndarray
    n_cand: np.ndarray
    page_tokens: int
    normaliser: float
    q: torch.Tensor  # [T, H, D]: all users' new history rows, then all candidate rows; before the SiLU
    k: torch.Tensor  # the new tokens' keys and values, before the SiLU (history ones are in the pool, after it)
    v: torch.Tensor
    keys: list[torch.Tensor]  # per user, every history token's key [kv_len, H, D] (past + new), after the SiLU
    values: list[torch.Tensor]
    pool_k: torch.Tensor  # [slots, H, D]; slots no user token occupies hold NaN
    pool_v: torch.Tensor
    page_table: torch.Tensor  # int32 [B, pages], each user's pages shuffled over the pool

    def plan(self, **kw) -> WorkPlan:
        return WorkPlan.plan(self.past, self.n_hist, self.n_cand, HEADS, **kw)

    def reference(self, plan: WorkPlan) -> torch.Tensor:
        return reference_attention(self.q, self.k, self.v, self.pool_k, self.pool_v, self.page_table,
                                   torch.from_numpy(plan.items), self.page_tokens, self.normaliser)


def make_case(past, n_hist, n_cand, page_tokens=4, seed=0, normaliser=50.0, spare_pages=3) -> Case:
    past, n_hist, n_cand = (np.asarray(a, dtype=np.int64) for a in (past, n_hist, n_cand))
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: 0.5 * torch.randn(*shape, generator=gen)  # noqa: E731
    kv_len = past + n_hist
    n_pages = -(-kv_len // page_tokens)
    total_pages = int(n_pages.sum()) + spare_pages
    order = np.random.default_rng(seed).permutation(total_pages)  # the pool's pages, shuffled over users
    page_table = np.zeros((len(past), max(1, int(n_pages.max()))), dtype=np.int32)
    pool_k = torch.full((total_pages * page_tokens, HEADS, DIM), float("nan"))
    pool_v = torch.full_like(pool_k, float("nan"))
    rows = int(n_hist.sum() + n_cand.sum())
    q, k, v = rand(rows, HEADS, DIM), rand(rows, HEADS, DIM), rand(rows, HEADS, DIM)
    keys, values, used, row = [], [], 0, 0
    for b in range(len(past)):
        page_table[b, :n_pages[b]] = order[used:used + n_pages[b]]
        used += n_pages[b]
        new = slice(row, row + int(n_hist[b]))
        row += int(n_hist[b])
        keys.append(torch.cat([rand(int(past[b]), HEADS, DIM), F.silu(k[new])]))
        values.append(torch.cat([rand(int(past[b]), HEADS, DIM), F.silu(v[new])]))
        pos = np.arange(kv_len[b])
        slots = torch.from_numpy(page_table[b, pos // page_tokens].astype(np.int64) * page_tokens + pos % page_tokens)
        pool_k[slots], pool_v[slots] = keys[-1], values[-1]
    return Case(past, n_hist, n_cand, page_tokens, normaliser, q, k, v, keys, values, pool_k, pool_v,
                torch.from_numpy(page_table))


def dense(case: Case) -> torch.Tensor:
    """First principles, one query row at a time: history at position p sees keys 0..p; a candidate
    sees all its user's history and itself; weights silu(q.k) / normaliser, no softmax; the new
    tokens' q, k and v activated by a SiLU first."""
    out = torch.zeros_like(case.q, dtype=torch.float64)
    hist_row = 0
    cand_row = int(case.n_hist.sum())
    for b in range(len(case.past)):
        keys, values = case.keys[b].double(), case.values[b].double()
        for i in range(int(case.n_hist[b])):
            p = int(case.past[b]) + i
            q = F.silu(case.q[hist_row].double())  # [H, D]
            w = F.silu(torch.einsum("hd,khd->hk", q, keys[:p + 1]))
            out[hist_row] = torch.einsum("hk,khd->hd", w, values[:p + 1])
            hist_row += 1
        for _ in range(int(case.n_cand[b])):
            q = F.silu(case.q[cand_row].double())
            w = F.silu(torch.einsum("hd,khd->hk", q, keys))
            own = F.silu((q * F.silu(case.k[cand_row].double())).sum(-1))  # [H]
            out[cand_row] = torch.einsum("hk,khd->hd", w, values) + own[:, None] * F.silu(case.v[cand_row].double())
            cand_row += 1
    return (out / case.normaliser).float()


# ---------------------------------------------------------------------------------------------- the plan

def coverage(plan: WorkPlan, past, n_hist, n_cand) -> tuple[list[np.ndarray], np.ndarray]:
    """How many items cover each (query row, key) of each user, and each candidate's own key."""
    kv_len = np.asarray(past) + np.asarray(n_hist)
    rows = int(np.sum(n_hist) + np.sum(n_cand))
    counts = [np.zeros((rows, int(n)), dtype=np.int64) for n in kv_len]
    own = np.zeros(rows, dtype=np.int64)
    for user, row0, n_rows, pos0, step, key0, key_end in plan.items.tolist():
        assert n_rows >= 1 and 0 <= key0 <= key_end <= kv_len[user]
        query_pos = pos0 + step * np.arange(n_rows)
        keys = np.arange(key0, key_end)
        seen = keys[None, :] <= query_pos[:, None]
        counts[user][row0:row0 + n_rows, key0:key_end] += seen
        if step == 0 and key0 == 0:
            own[row0:row0 + n_rows] += 1
    return counts, own


def expected_coverage(past, n_hist, n_cand) -> tuple[list[np.ndarray], np.ndarray]:
    kv_len = np.asarray(past) + np.asarray(n_hist)
    rows = int(np.sum(n_hist) + np.sum(n_cand))
    counts = [np.zeros((rows, int(n)), dtype=np.int64) for n in kv_len]
    own = np.zeros(rows, dtype=np.int64)
    hist_row, cand_row = 0, int(np.sum(n_hist))
    for b in range(len(past)):
        for i in range(int(n_hist[b])):
            counts[b][hist_row, :past[b] + i + 1] = 1
            hist_row += 1
        for _ in range(int(n_cand[b])):
            counts[b][cand_row, :] = 1
            own[cand_row] = 1
            cand_row += 1
    return counts, own


@settings(max_examples=60, deadline=None)
@given(users=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 300), st.integers(0, 40)), min_size=1,
                      max_size=5),
       block_m=st.sampled_from([1, 3, 16, 128]), chunk_block_m=st.sampled_from([1, 2, 64]),
       min_programs=st.sampled_from([0, 1, 8, 512, 100_000]))
def test_the_plan_covers_every_row_once_per_key(users, block_m, chunk_block_m, min_programs):
    past, n_hist, n_cand = (np.array(a, dtype=np.int64) for a in zip(*users))
    plan = WorkPlan.plan(past, n_hist, n_cand, HEADS, block_m=block_m, min_programs=min_programs,
                         chunk_block_m=chunk_block_m)
    assert plan.items.dtype == np.int32 and plan.items.shape[1] == 7 and plan.items.flags.c_contiguous

    def blocks(rows: int) -> int:
        return int(np.sum(-(-n_hist // rows)) + np.sum(-(-n_cand // rows)))

    assert plan.split == (0 < blocks(block_m) * HEADS < min_programs)
    # a split plan is cut to the chunks' tiles: every item fits the launch that runs it
    assert np.all(plan.items[:, 2] <= (chunk_block_m if plan.split else block_m))
    if not plan.split:  # one item per block, each row written once
        assert len(plan.items) == blocks(block_m) and np.all(plan.items[:, 5] == 0)
    # the capacity, by hand: the blocks, plus at most min_programs / heads chunks when split
    want_capacity = blocks(chunk_block_m) + min_programs // HEADS if plan.split else blocks(block_m)
    assert len(plan.items) <= plan.capacity == want_capacity
    got, got_own = coverage(plan, past, n_hist, n_cand)
    want, want_own = expected_coverage(past, n_hist, n_cand)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(got_own, want_own)
    work = plan.items[:, 6] - plan.items[:, 5]
    assert np.all(np.diff(work) <= 0)  # longest first


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 9000), min_size=1, max_size=8), candidates=st.integers(1, 300))
def test_fully_cached_users_of_any_lengths_stay_within_the_capacity(lengths, candidates):
    # the capacity is the same for every length: one CUDA graph shape covers them all
    past = np.array(lengths)
    plan = WorkPlan.plan(past, np.zeros_like(past), np.full(len(past), candidates), HEADS)
    assert len(plan.items) <= plan.capacity
    other = WorkPlan.plan(np.full(len(past), 9000), np.zeros_like(past), np.full(len(past), candidates), HEADS)
    assert plan.capacity == other.capacity


def test_a_few_candidate_blocks_facing_many_keys_are_split():
    plan = WorkPlan.plan(np.array([3000, 2000]), np.array([0, 0]), np.array([10, 10]), HEADS)
    assert plan.split and len(plan.items) > 2
    assert np.all(plan.items[:, 5] % 64 == 0)  # chunks start on the kernel's key blocks
    assert not WorkPlan.plan(np.array([3000]), np.array([0]), np.array([10]), HEADS, min_programs=1).split


def test_the_cpp_backends_plan_is_cut_to_the_kernels_tiles():
    # cpp/backend/work_plan.h plans the C++ backend's steps for the package's kernel, compiled with LAUNCH:
    # an item of more rows than its launch's tile would lose the rest (only a GPU run would show it)
    header = (ROOT / "cpp" / "backend" / "work_plan.h").read_text()
    constants = {name: int(value) for name, value in re.findall(r"constexpr int64_t (k\w+) = (\d+);", header)}
    assert {k: constants[k] for k in ("kBlockM", "kChunkBlockM", "kBlockN", "kMinPrograms")} == {
        "kBlockM": LAUNCH.block_m, "kChunkBlockM": LAUNCH.chunk_block_m, "kBlockN": LAUNCH.block_n,
        "kMinPrograms": MIN_PROGRAMS}


# ---------------------------------------------------------------------------------- the plain twin

def test_reference_attention_is_hstu_attention_from_first_principles():
    # cold, cached with new tokens, fully cached (no new history), no candidates; several blocks per user
    case = make_case(past=[0, 5, 9, 3], n_hist=[7, 6, 0, 4], n_cand=[2, 3, 4, 0], page_tokens=4)
    want = dense(case)
    for kw in ({"block_m": 4, "min_programs": 1}, {"block_m": 3}, {}):
        plan = case.plan(**kw)
        got = case.reference(plan)
        assert got.dtype == torch.float32 and got.shape == case.q.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        # given the candidates' new keys and values alone (what a batched step passes), the same
        cands = slice(int(case.n_hist.sum()), None)
        alone = reference_attention(case.q, case.k[cands], case.v[cands], case.pool_k, case.pool_v, case.page_table,
                                    torch.from_numpy(plan.items), case.page_tokens, case.normaliser)
        torch.testing.assert_close(alone, want, atol=1e-5, rtol=0)


def test_split_and_unsplit_plans_agree():
    case = make_case(past=[600, 0, 300], n_hist=[20, 150, 0], n_cand=[7, 5, 30], page_tokens=16, seed=3)
    split = case.plan()
    whole = case.plan(min_programs=1)
    assert split.split and not whole.split and len(split.items) > len(whole.items)
    assert np.any(split.items[:, 5] > 0)  # keys really were cut
    got_split, got_whole = case.reference(split), case.reference(whole)
    torch.testing.assert_close(got_split, got_whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_whole, dense(case), atol=1e-5, rtol=0)


def test_paged_attention_on_cpu_is_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = make_case(past=[10, 0], n_hist=[3, 8], n_cand=[2, 2], page_tokens=8, seed=5)
    plan = case.plan()
    got = paged_attention(case.q, case.k, case.v, case.pool_k, case.pool_v, case.page_table, plan.split,
                          torch.from_numpy(plan.items), case.page_tokens, case.normaliser)
    torch.testing.assert_close(got, case.reference(plan), atol=0, rtol=0)


# ---------------------------------------------------------------------------------- the Triton kernel

KERNEL_CASES = [
    # past, new history, candidates, page size: a block of > BLOCK_M new rows, a user with no new history,
    # a cold user, keys enough to be split in chunks, pages that do not divide the kernel's key blocks
    dict(past=[300, 0, 77], n_hist=[BLOCK_M + 9, 12, 0], n_cand=[5, 3, 20], page_tokens=16, seed=11),
    dict(past=[0, 530], n_hist=[40, 0], n_cand=[1, 9], page_tokens=24, seed=12),
]


def _kernel_main() -> None:
    """Run in a child with TRITON_INTERPRET=1: the kernel against the twin, printed as JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    results = []
    for spec in KERNEL_CASES:
        case = make_case(**spec)
        for plan, pad in itertools.product((case.plan(), case.plan(min_programs=1)), (0, 3)):
            # padded as a CUDA graph pads a step (items of no rows after the real ones), then run last item
            # first: a GPU runs them in any order, so no item may rely on another having run before it
            items = np.concatenate([plan.items, np.zeros((pad, 7), dtype=plan.items.dtype)])
            items = torch.from_numpy(np.ascontiguousarray(items[::-1] if pad else items))
            want = case.reference(plan)
            # the padded runs get the candidates' keys and values alone, as a batched step passes them
            k, v = (t[int(case.n_hist.sum()):] if pad else t for t in (case.k, case.v))
            # the kernel's split mode whatever the plan, as a compiled step runs it: whole items write
            for split in sorted({plan.split, True}):
                got = paged_attention(case.q, k, v, case.pool_k, case.pool_v, case.page_table, split,
                                      items, case.page_tokens, case.normaliser)
                results.append({"kernel": "hstu_replay.server.attention_kernel" in sys.modules, "split": split,
                                "plan_split": plan.split, "padded": pad, "k_rows": len(k),
                                "cut": bool(np.any(plan.items[:, 5] > 0)),
                                "dtype": str(got.dtype), "shape": list(got.shape),
                                "finite": bool(got.isfinite().all()), "max_diff": float((got.float() - want).abs().max()),
                                "max_diff_dense": float((want - dense(case)).abs().max()),
                                "scale": float(want.abs().max())})
    print("RESULTS " + json.dumps(results))


def test_the_triton_kernel_equals_the_reference_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = "import tests.server.test_paged_attention as t; t._kernel_main()"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULTS "))
    results = json.loads(line[len("RESULTS "):])
    assert [(r["plan_split"], r["split"], r["padded"]) for r in results] == [
        (True, True, 0), (True, True, 3), (False, False, 0), (False, True, 0), (False, False, 3), (False, True, 3)] * 2
    assert results[0]["cut"] and results[6]["cut"]  # the split plans really cut keys into chunks
    # the padded runs had the candidates' keys alone, fewer than the queries' rows
    assert all((r["k_rows"] == sum(spec["n_cand"])) == bool(r["padded"])
               for r, spec in zip(results, [s for s in KERNEL_CASES for _ in range(6)]))
    for r in results:
        assert r["kernel"] and r["dtype"] == "torch.float32" and r["finite"], r
        assert r["scale"] > 1e-2, r  # not trivially zero
        assert r["max_diff"] <= 1e-4, r
        assert r["max_diff_dense"] <= 1e-5, r
