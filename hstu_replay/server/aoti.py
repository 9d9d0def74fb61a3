"""AOTInductor packages of the model: export + compile once, load in milliseconds to serve.

`export_package` writes the per-user KV step (`model.KVStep`); `load_package` gives back a
callable with the eager `Compute` signature. `export_nocache_package` writes the published
`hstu_gr_ranking` interface: (values, lengths, num_candidates) -> logits, self-contained.
`export_batched_step` writes the batched engine's whole forward pass (`batched_step.BatchedStep`:
paged pool written in place, attention kernel inside on a GPU); `BatchedStepPackage` runs it.
Loading uses torch's AOTIModelPackageLoader directly: `aoti_load_package` would run a C++
compiler at load time, which a server must not need.

Where the C++ compiler finds no shared libstdc++ to link (`g++ -print-file-name=libstdc++.so`
names no file, as on an image with a compiler but without its development link), it links the
static archive into the package; that copy's locale then mixes with the process's own
libstdc++ and the package crashes when it loads (in `std::regex`, parsing its device string).
`runtime_link_options` then names the shared runtime to the linker explicitly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx.experimental._config
from torch import Tensor
from torch.export import Dim

from hstu_replay.errors import InputError
from hstu_replay.interface import NUM_CONTEXT_TOKENS
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.model import MIN_SIZE, HSTUModel, JaggedRanker, KVStep, padded_call, torch_dtype


@dataclass(frozen=True)
class PackageInfo:
    path: Path
    compile_seconds: float  # export + AOTInductor compile, wall clock


def export_package(model: HSTUModel, config: ModelConfig, path: str | os.PathLike) -> PackageInfo:
    """Compile the per-user KV step with dynamic past, new-history and candidate lengths."""
    L, H, D = config.num_layers, config.num_heads, config.head_dim
    dtype, device = torch_dtype(config), _device(model)
    past = Dim("past", min=MIN_SIZE, max=config.max_history_tokens + MIN_SIZE)
    hist = Dim("hist", min=MIN_SIZE, max=config.max_history_tokens + MIN_SIZE)
    cand = Dim("cand", min=MIN_SIZE, max=config.max_candidates + MIN_SIZE)
    # Example sizes distinct from each other and from MIN_SIZE, so no dim is unified or specialised.
    args = (
        torch.zeros(7, dtype=torch.int64, device=device),
        torch.zeros(5, dtype=torch.int64, device=device),
        torch.zeros(L, 9, H, D, dtype=dtype, device=device),
        torch.zeros(L, 9, H, D, dtype=dtype, device=device),
        torch.tensor([9, 7, 5], dtype=torch.int64, device=device),
    )
    shapes = ({0: hist}, {0: cand}, {1: past}, {1: past}, None)
    return _compile(KVStep(model).eval(), args, shapes, path)


def export_nocache_package(model: HSTUModel, config: ModelConfig, path: str | os.PathLike) -> PackageInfo:
    """Compile the published no-cache interface (values, lengths, num_candidates) -> logits."""
    values, lengths, num_candidates = (t.to(_device(model)) for t in _example_request())
    batch = Dim("batch", min=1, max=config.max_batch)
    n_values = Dim("values", min=1, max=config.limits.max_values)
    shapes = ({0: n_values}, {0: 8 * batch}, {0: batch})
    return _compile(JaggedRanker(model).eval(), (values, lengths, num_candidates), shapes, path)


def export_batched_step(model: HSTUModel, page_tokens: int, path: str | os.PathLike) -> PackageInfo:
    """Compile the batched forward pass with dynamic token, user, page, item, slot and pool sizes."""
    from hstu_replay.server.attention_ops import exportable
    from hstu_replay.server.batched_step import BatchedStep

    cfg, device = model.config, _device(model)
    dtype = next(model.parameters()).dtype
    tokens, users, width = Dim("tokens", min=2, max=cfg.max_batch * (cfg.max_history_tokens + cfg.max_candidates) + 1), \
        Dim("users", min=1, max=cfg.max_batch), Dim("pages", min=1)
    items, slots, pool = Dim("items", min=1), Dim("slots", min=0, max=cfg.max_batch * cfg.max_history_tokens), Dim("pool")
    # Example sizes distinct from each other and above 1, so no dim is unified or specialised.
    n_hist, n_cand, n_users, n_pages, n_items, n_slots = 11, 6, 3, 5, 4, 12 * page_tokens
    step = BatchedStep(model, page_tokens, exportable(device, page_tokens, cfg.attn_normaliser)).eval()
    int64 = dict(dtype=torch.int64, device=device)
    pool_shape = (cfg.num_layers, n_slots, cfg.num_heads, cfg.head_dim)
    args = (torch.zeros(n_hist + n_cand, **int64), torch.zeros(n_hist + n_cand, **int64),
            torch.zeros(n_hist + n_cand, **int64), torch.zeros(n_users, n_pages, **int64),
            torch.zeros(n_items, 7, **int64), torch.arange(n_hist, **int64),
            torch.zeros(pool_shape, dtype=dtype, device=device), torch.zeros(pool_shape, dtype=dtype, device=device))
    shapes = ({0: tokens}, {0: tokens}, {0: tokens}, {0: users, 1: width}, {0: items}, {0: slots},
              {1: pool}, {1: pool})
    # sizes 0 and 1 are real here (a fully cached request writes no slot; one user has one candidate):
    # reason about every size alike instead of assuming them away
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        return _compile(step, args, shapes, path)


def _device(model: HSTUModel) -> torch.device:
    return next(model.parameters()).device


def _example_request() -> tuple[Tensor, Tensor, Tensor]:
    """Three users with distinct history and candidate counts (no size 0 or 1 to specialise)."""
    hist, cand = [5, 9, 2], [3, 4, 6]
    gen = torch.Generator().manual_seed(0)
    head = torch.arange(1, NUM_CONTEXT_TOKENS * len(hist) + 1)
    items = [torch.randint(0, 1 << 30, (h + c,), generator=gen) for h, c in zip(hist, cand)]
    actions = [torch.cat([torch.randint(0, 256, (h,), generator=gen), torch.zeros(c, dtype=torch.int64)])
               for h, c in zip(hist, cand)]
    seq = [h + c for h, c in zip(hist, cand)]
    lengths = torch.tensor([1] * NUM_CONTEXT_TOKENS * len(hist) + seq + seq)
    return torch.cat([head, *items, *actions]), lengths, torch.tensor(cand)


#: what the linker is given when the compiler has no shared libstdc++ of its own to link
SHARED_RUNTIME = ":libstdc++.so.6"


def runtime_link_options(compiler: str | None = None, force: bool = False) -> dict:
    """Inductor options that make a package link the shared C++ runtime; {} where the compiler does already."""
    compiler = compiler or os.environ.get("CXX", "g++")
    try:
        found = subprocess.run([compiler, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    if not force and os.path.isabs(found) and os.path.exists(found):
        return {}
    return {"aot_inductor.custom_op_libs": [SHARED_RUNTIME]}


def _compile(module: torch.nn.Module, args: tuple, shapes: tuple, path: str | os.PathLike) -> PackageInfo:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with _quiet(), torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=shapes, strict=False)
        torch._inductor.aoti_compile_and_package(program, package_path=str(path),
                                                 inductor_configs=runtime_link_options())
    return PackageInfo(path, time.perf_counter() - started)


@contextlib.contextmanager
def _quiet():
    """Inductor and export log and warn a lot at INFO/WARNING; keep the tool's output clean."""
    names = ("torch._inductor", "torch._export", "torch.export", "torch.fx.experimental.symbolic_shapes",
             "torch._dynamo", "torch.utils._sympy")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _loader(path: str | os.PathLike, single_threaded: bool = False):
    """`single_threaded`: for a caller that never runs it from two threads at once; the runner then
    records no CUDA event per call, and its calls can be captured in a CUDA graph (an event query
    inside a capture is refused: "operation not permitted when stream is capturing")."""
    if not Path(path).is_file():
        raise InputError(f"{path}: no AOTInductor package there")
    try:
        return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", single_threaded, 1, -1)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{path}: cannot load the AOTInductor package ({first})") from None


class PackageCompute:
    """A loaded KV-step package behind the engine's `Compute` call (same signature as eager)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._loader = _loader(path)

    def _step(self, *inputs: Tensor) -> list[Tensor]:
        return self._loader.run([t.contiguous() for t in inputs])

    def __call__(self, hist_ids: Tensor, cand_ids: Tensor, past_k: Tensor, past_v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        with torch.inference_mode():
            return padded_call(self._step, hist_ids, cand_ids, past_k, past_v)


class NoCachePackage:
    """A loaded no-cache package: (values, lengths, num_candidates) int64 1-D -> logits [N, 8].

    Inputs go to the device the package was compiled for (a CUDA package handed host memory
    reads it as device addresses: an illegal memory access)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._loader = _loader(path)
        self.device = torch.device(self._loader.get_metadata().get("AOTI_DEVICE_KEY") or "cpu")

    def __call__(self, values: Tensor, lengths: Tensor, num_candidates: Tensor) -> Tensor:
        with torch.inference_mode():
            inputs = [t.to(self.device).contiguous() for t in (values, lengths, num_candidates)]
            return self._loader.run(inputs)[0]


class BatchedStepPackage:
    """A loaded batched-step package behind `BatchedStep`'s call (its `split` is not needed: the
    package's attention is right for any plan). Its caller, the batched engine, runs
    one call at a time (under its lock)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._loader = _loader(path, single_threaded=True)

    def __call__(self, ids: Tensor, kinds: Tensor, positions: Tensor, page_table: Tensor, items: Tensor, slots: Tensor,
                 pool_k: Tensor, pool_v: Tensor, split: bool = True) -> Tensor:
        tokens = ids.shape[0]
        if tokens == 1:  # one candidate and nothing else: pad a row that no work item reads (dropped again)
            ids, kinds, positions = (torch.cat([t, t]) for t in (ids, kinds, positions))
        inputs = [t if t.is_contiguous() else t.contiguous() for t in (ids, kinds, positions, page_table, items, slots)]
        return self._loader.run([*inputs, pool_k, pool_v])[0][:tokens - slots.shape[0]]


def load_batched_step(path: str | os.PathLike) -> BatchedStepPackage:
    """Load a batched-step package without a compiler; on a CPU, its attention operator is this process's."""
    import hstu_replay.server.attention_ops  # noqa: F401  (registers hstu_replay::paged_attention)

    return BatchedStepPackage(path)


def load_package(path: str | os.PathLike) -> PackageCompute:
    """Load a KV-step package without a compiler (milliseconds)."""
    return PackageCompute(path)


def load_nocache_package(path: str | os.PathLike) -> NoCachePackage:
    return NoCachePackage(path)
