"""From a config name to a compiled repository, and to the serving engines of each kind.

Engine kinds: `aoti` serves the AOTInductor packages of a compiled repository, one user after
another (the published torch_aoti path); `batched` serves the eager model with every user of a
request in one pass over a paged KV pool (`batched.BatchedEngine`; the fast path on a GPU);
`batched-aoti` is that engine with its whole forward pass (pool writes and attention kernel
included) compiled by AOTInductor into the repository. `prepare_engine` compiles what a kind
needs before any server process loads it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hstu_replay.errors import ConfigError, InputError
from hstu_replay.interface import KVCACHE, NOCACHE
from hstu_replay.server.aoti import export_nocache_package, export_package, load_nocache_package, load_package
from hstu_replay.server.model_config import ModelConfig, get_config
from hstu_replay.server.engine import PackagedRanker, RankingEngine
from hstu_replay.server.host_tier import KVLayout
from hstu_replay.server.kvcache import KVCache
from hstu_replay.server.model import build_model, torch_dtype, weights_digest
from hstu_replay.server.repository import RepositoryLayout, TargetMeta, read_meta, write_configs, write_meta
from hstu_replay.server.serve import Engines
from hstu_replay.server.serve_config import HostTierOptions


def export_repository(root: str | Path, config_name: str, seed: int, device: str, force: bool = False) -> TargetMeta:
    """Compile both packages unless the repository already holds them for this config, seed and weights."""
    layout = RepositoryLayout(Path(root))
    config = get_config(config_name)
    if not force and layout.is_complete():
        meta = read_meta(layout)
        if stale_reason(meta, config_name, seed, device) is None:
            return meta
    print(f"hstu-replay: compiling the {config_name} model with AOTInductor into {root} "
          f"(one time; about a minute on a CPU)...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    model = build_model(config, seed).to(device)
    export_package(model, config, layout.package(KVCACHE))
    export_nocache_package(model, config, layout.package(NOCACHE))
    write_configs(layout)
    meta = TargetMeta(config=config_name, seed=seed, device=device,
                      compile_seconds=round(time.perf_counter() - started, 1), torch_version=torch.__version__,
                      weights=weights_digest(config, seed))
    write_meta(layout, meta)
    print(f"hstu-replay: compiled in {meta.compile_seconds} s", file=sys.stderr, flush=True)
    return meta


def stale_reason(meta: TargetMeta, config_name: str, seed: int, device: str) -> str | None:
    """Why a compiled repository's record does not serve this config, seed and device as they are (None: it does)."""
    if (meta.config, meta.seed, meta.device) != (config_name, seed, device):
        return (f"compiled for config {meta.config}, seed {meta.seed}, device {meta.device}; "
                f"asked for {config_name}, {seed}, {device}")
    if meta.weights != weights_digest(get_config(config_name), seed):
        return (f"compiled from other weights than this version of the model draws for seed {seed} "
                f"(another version of hstu-replay)")
    return None


def load_engines(root: str | Path, cache_budget_tokens: int | None, page_tokens: int, device: str,
                 host: HostTierOptions = HostTierOptions()) -> Engines:
    """The `aoti` engines of a compiled repository (with a host tier behind the cache when `host` has a budget)."""
    layout = RepositoryLayout(Path(root))
    if not layout.is_complete():
        raise InputError(f"{root}: no compiled repository here; run `hstu-replay server export` first")
    meta = read_meta(layout)
    config = get_config(meta.config)
    kv = KVLayout(config.num_layers, config.num_heads, config.head_dim, torch_dtype(config))
    cache = KVCache(cache_budget_tokens if cache_budget_tokens else 1 << 62, page_tokens,
                    host.build(page_tokens, kv, device), kv)
    cached = RankingEngine(config, load_package(layout.package(KVCACHE)), cache, device)
    uncached = PackagedRanker(config, load_nocache_package(layout.package(NOCACHE)))
    return Engines(cached=cached, uncached=uncached)


def _aoti_engines(repository: str | Path, config: ModelConfig, seed: int, cache_budget_tokens: int,
                  page_tokens: int, device: str, host: HostTierOptions = HostTierOptions(),
                  reserve_pool: bool = False) -> Engines:
    """Each user's K/V in tensors of its own: no pool (`reserve_pool` is refused by the command)."""
    _prepare_aoti(repository, config, seed, page_tokens, device)
    return load_engines(repository, cache_budget_tokens, page_tokens, device, host)


def _batched_engines(repository: str | Path, config: ModelConfig, seed: int, cache_budget_tokens: int,
                     page_tokens: int, device: str, host: HostTierOptions = HostTierOptions(),
                     reserve_pool: bool = False) -> Engines:
    """One eager model; the no-cache models get a pool that keeps nothing. `repository` is unused."""
    from hstu_replay.server.batched import build_batched_engine

    model = build_model(config, seed).to(device)
    return Engines(cached=build_batched_engine(model, cache_budget_tokens, page_tokens, host, reserve=reserve_pool),
                   uncached=build_batched_engine(model, 0, page_tokens))


def batched_step_path(repository: str | Path, config: ModelConfig, seed: int, page_tokens: int, device: str) -> Path:
    """Where `batched-aoti` keeps its package: one per config, type, device, page size, weights and torch."""
    return RepositoryLayout(Path(repository)).batched_step(
        f"{config.name}-{config.dtype}-{device}-page{page_tokens}-seed{seed}-w{weights_digest(config, seed)}"
        f"-torch{torch.__version__}")


def _compile_batched_step(repository: str | Path, config: ModelConfig, seed: int, page_tokens: int,
                          device: str) -> Path:
    """The package's path, compiled there first when missing."""
    from hstu_replay.server.aoti import export_batched_step

    path = batched_step_path(repository, config, seed, page_tokens, device)
    if not path.is_file():
        print(f"hstu-replay: compiling the batched {config.name} step with AOTInductor into {path} "
              f"(one time; a minute or more)...", file=sys.stderr, flush=True)
        info = export_batched_step(build_model(config, seed).to(device), page_tokens, path)
        print(f"hstu-replay: compiled in {info.compile_seconds:.1f} s", file=sys.stderr, flush=True)
    return path


def _batched_aoti_engines(repository: str | Path, config: ModelConfig, seed: int, cache_budget_tokens: int,
                          page_tokens: int, device: str, host: HostTierOptions = HostTierOptions(),
                          reserve_pool: bool = False) -> Engines:
    """`batched` with the package of its forward pass (compiled into `repository` when missing)."""
    from hstu_replay.server.aoti import load_batched_step
    from hstu_replay.server.batched import build_batched_engine

    package = load_batched_step(_compile_batched_step(repository, config, seed, page_tokens, device))
    model = build_model(config, seed).to(device)
    return Engines(cached=build_batched_engine(model, cache_budget_tokens, page_tokens, host, package, reserve_pool),
                   uncached=build_batched_engine(model, 0, page_tokens, forward_step=package))


ENGINE_KINDS: dict[str, Callable[..., Engines]] = {"aoti": _aoti_engines, "batched": _batched_engines,
                                                   "batched-aoti": _batched_aoti_engines}


def _prepare_aoti(repository: str | Path, config: ModelConfig, seed: int, page_tokens: int, device: str) -> None:
    if config != get_config(config.name):
        raise ConfigError("--dtype applies to --engine batched and batched-aoti; the compiled packages keep the "
                          "config's type")
    export_repository(repository, config.name, seed, device)


#: what an engine kind compiles before it serves (kinds not named here need nothing)
_PREPARE: dict[str, Callable[..., object]] = {"aoti": _prepare_aoti, "batched-aoti": _compile_batched_step}


def prepare_engine(kind: str, repository: str | Path, config: ModelConfig, seed: int, page_tokens: int,
                   device: str) -> None:
    """Compile what engine `kind` serves from, once, before any server process loads it."""
    if kind in _PREPARE:
        _PREPARE[kind](repository, config, seed, page_tokens, device)
