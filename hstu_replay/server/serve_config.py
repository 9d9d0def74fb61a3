"""`server serve`'s typed config: one frozen section per concern, built once from the parsed options.

`ServeConfig.from_args` reads argparse's namespace into the engine, the cache (and its host tier),
the network (`serve.ServeOptions`) and the frontend; each section checks its own values and the
frontend (`frontends.FRONTENDS`) refuses what it does not serve. Every error is one line naming the
options and the fix (exit 2), before any work. Torch-free: the config is built before the model's
threads are set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, OffloadMode
from hstu_replay.errors import ConfigError
from hstu_replay.server.frontends import FRONTENDS, Engine, Frontend
from hstu_replay.server.serve import RequiredHeader, ServeOptions
from hstu_replay.server.tls_proxy import TlsFiles

if TYPE_CHECKING:
    import argparse

    import torch

    from hstu_replay.server.host_tier import HostTier, KVLayout


@dataclass(frozen=True)
class HostTierOptions:
    """The host tier behind the KV cache: `--host-budget-tokens`, `--offload-mode`, `--offload-chunk-tokens`."""

    budget_tokens: int = 0  # 0: no host tier
    mode: OffloadMode = OffloadMode.NATIVE
    chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS

    def __post_init__(self) -> None:
        if self.budget_tokens < 0:
            raise ConfigError(f"--host-budget-tokens {self.budget_tokens}: use 0 (no host tier) or a positive count")
        if self.chunk_tokens < 1:
            raise ConfigError(f"--offload-chunk-tokens {self.chunk_tokens}: must be at least 1")

    def build(self, page_tokens: int, layout: KVLayout, device: str | torch.device) -> HostTier | None:
        if self.budget_tokens == 0:
            return None
        from hstu_replay.server.host_tier import HostTier

        return HostTier(self.budget_tokens, page_tokens, self.mode, layout, device, self.chunk_tokens)


@dataclass(frozen=True)
class EngineConfig:
    """What is served and how (--engine, --repository, --config, --seed, --device, --dtype, --threads)."""

    kind: Engine
    repository: Path
    config: str  # model_config's name
    seed: int
    device: str  # auto, cpu or cuda: resolved when serving
    dtype: str | None = None  # None: the config's
    threads: int = 0  # 0: threads.model_threads' policy
    defaulted: bool = False  # `kind` is the frontend's default (--engine not given)

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ConfigError(f"--threads {self.threads}: use 0 (the default policy) or a positive count")


@dataclass(frozen=True)
class CacheConfig:
    """The KV cache (--cache-budget-tokens, --page-tokens, --reserve-pool) and its host tier."""

    budget_tokens: int
    page_tokens: int
    reserve_pool: bool = False  # the pool's whole budget taken at start
    host: HostTierOptions = HostTierOptions()


@dataclass(frozen=True)
class ServeConfig:
    """`server serve`, checked: the frontend refuses here what it does not serve."""

    frontend: Frontend
    engine: EngineConfig
    cache: CacheConfig
    network: ServeOptions

    def __post_init__(self) -> None:
        FRONTENDS[self.frontend].check(self)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        frontend = Frontend(args.frontend)
        kind = Engine(args.engine) if args.engine is not None else FRONTENDS[frontend].default_engine
        engine = EngineConfig(kind=kind, repository=Path(args.repository), config=args.config, seed=args.seed,
                              device=args.device, dtype=args.dtype, threads=args.threads,
                              defaulted=args.engine is None)
        host = HostTierOptions(budget_tokens=args.host_budget_tokens, mode=OffloadMode(args.offload_mode),
                               chunk_tokens=args.offload_chunk_tokens)
        cache = CacheConfig(budget_tokens=args.cache_budget_tokens, page_tokens=args.page_tokens,
                            reserve_pool=args.reserve_pool, host=host)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        network = ServeOptions(
            host=args.host, http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
            cache_metrics_port=args.cache_metrics_port, log_verbose=args.log_verbose,
            tls=TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert else None, https_port=args.https_port,
            required_header=RequiredHeader.parse(args.require_header) if args.require_header is not None else None,
            publish_limits=not args.no_limit_parameters)
        return cls(frontend=frontend, engine=engine, cache=cache, network=network)
