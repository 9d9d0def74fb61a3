"""`server serve --frontend`: how tritonserver reaches the reference engines, one registry.

Each frontend declares the engines it serves (the first is its default, said in `--engine`'s help
and printed when the default is taken), the combinations it refuses (each a line naming the options
and the fix, before any work) and the function that serves a checked `ServeConfig`. `--frontend`'s
choices, `--engine`'s default and every check read `FRONTENDS`; nothing else names frontends.
Torch-free: the command line is built from it before the model's threads are set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from hstu_replay.errors import ConfigError

if TYPE_CHECKING:
    from hstu_replay.server.model_config import ModelConfig
    from hstu_replay.server.serve_config import ServeConfig


class Engine(StrEnum):
    """--engine: the engine kinds (`build.ENGINE_KINDS`' keys)."""

    AOTI = "aoti"  # the compiled packages, one user at a time, each user's K/V in tensors of its own
    BATCHED = "batched"  # every user of a request in one pass over a paged KV pool
    BATCHED_AOTI = "batched-aoti"  # that pass compiled by AOTInductor

    @property
    def pooled(self) -> bool:
        """Its KV cache is one pool of pages (what --reserve-pool takes whole)."""
        return self is not Engine.AOTI


class Frontend(StrEnum):
    """--frontend."""

    PYTRITON = "pytriton"
    PYTHON_BACKEND = "python-backend"
    CPP_BACKEND = "cpp-backend"


@dataclass(frozen=True)
class Refusal:
    """A combination a frontend refuses: `options` names it; `reason(config)` is its one line, or
    None where `config` is not that combination."""

    options: str
    reason: Callable[[ServeConfig], str | None]


def _reserve_needs_a_pool(config: ServeConfig) -> str | None:
    if not config.cache.reserve_pool or config.engine.kind.pooled:
        return None
    return (f"--reserve-pool: --engine {config.engine.kind} keeps each user's K/V apart, in no pool; use "
            f"--engine {' or '.join(e for e in Engine if e.pooled)}")


RESERVE_NEEDS_A_POOL = Refusal("--reserve-pool --engine aoti", _reserve_needs_a_pool)


def _serve_pytriton(config: ServeConfig, model: ModelConfig, device: str) -> None:
    from hstu_replay.server.build import ENGINE_KINDS, prepare_engine
    from hstu_replay.server.serve import serve

    engine, cache = config.engine, config.cache
    prepare_engine(engine.kind, engine.repository, model, engine.seed, cache.page_tokens, device)
    engines = ENGINE_KINDS[engine.kind](engine.repository, model, engine.seed, cache.budget_tokens, cache.page_tokens,
                                        device, cache.host, cache.reserve_pool)
    serve(engines, config.network)


def _serve_python_backend(config: ServeConfig, model: ModelConfig, device: str) -> None:
    from hstu_replay.server.build import prepare_engine
    from hstu_replay.server.python_backend import BackendSettings, serve_native

    engine, cache = config.engine, config.cache
    prepare_engine(engine.kind, engine.repository, model, engine.seed, cache.page_tokens, device)
    network = config.network
    settings = BackendSettings(
        role="cached", model="", engine=engine.kind.value, repository=str(engine.repository.resolve()),
        config=engine.config, dtype=engine.dtype, seed=engine.seed, cache_budget_tokens=cache.budget_tokens,
        page_tokens=cache.page_tokens, device=device, host=network.host,
        cache_metrics_port=network.cache_metrics_port, control_socket="",
        host_budget_tokens=cache.host.budget_tokens, offload_mode=cache.host.mode.value,
        offload_chunk_tokens=cache.host.chunk_tokens, reserve_pool=cache.reserve_pool)
    serve_native(settings, network)


def _serve_cpp_backend(config: ServeConfig, model: ModelConfig, device: str) -> None:
    from hstu_replay.server.build import batched_step_path, prepare_engine
    from hstu_replay.server.cpp_backend import CppBackendSettings, build_backend, serve_cpp

    engine, cache = config.engine, config.cache
    library = build_backend()  # first: a missing compiler or CMake is said before the package's compile
    prepare_engine(engine.kind, engine.repository, model, engine.seed, cache.page_tokens, device)
    package = batched_step_path(engine.repository, model, engine.seed, cache.page_tokens, device)
    settings = CppBackendSettings(config=model, package=package, cache_budget_tokens=cache.budget_tokens,
                                  page_tokens=cache.page_tokens, host=cache.host, reserve_pool=cache.reserve_pool)
    serve_cpp(settings, config.network, library)


@dataclass(frozen=True)
class FrontendKind:
    """One `--frontend`: the engines it serves (the first its default), what it refuses, how it serves."""

    name: Frontend
    engines: tuple[Engine, ...]
    serve: Callable[[ServeConfig, ModelConfig, str], None]  # (config, the model's sizes, the resolved device)
    refusals: tuple[Refusal, ...] = ()
    help: str = ""

    @property
    def default_engine(self) -> Engine:
        return self.engines[0]

    def check(self, config: ServeConfig) -> None:
        """What this frontend does not serve, refused in one line (ConfigError, exit 2)."""
        if config.engine.kind not in self.engines:
            raise ConfigError(f"--frontend {self.name} serves --engine {' or '.join(self.engines)} only "
                              f"(got --engine {config.engine.kind})")
        for refusal in self.refusals:
            reason = refusal.reason(config)
            if reason is not None:
                raise ConfigError(reason)


FRONTENDS: dict[Frontend, FrontendKind] = {kind.name: kind for kind in (
    FrontendKind(Frontend.PYTRITON, (Engine.AOTI, Engine.BATCHED, Engine.BATCHED_AOTI), _serve_pytriton,
                 (RESERVE_NEEDS_A_POOL,),
                 "PyTriton binds the models (one proxy process between tritonserver and the engine)"),
    FrontendKind(Frontend.PYTHON_BACKEND, (Engine.AOTI, Engine.BATCHED, Engine.BATCHED_AOTI), _serve_python_backend,
                 (RESERVE_NEEDS_A_POOL,),
                 "a Python-backend model repository served by tritonserver directly, each model's engine inside "
                 "its backend stub (no proxy)"),
    FrontendKind(Frontend.CPP_BACKEND, (Engine.BATCHED_AOTI,), _serve_cpp_backend, (),
                 "our C++ Triton backend (cpp/backend, built with CMake once) serving the batched-aoti package, "
                 "no Python in tritonserver's process; its host tier is its own C++ one"),
)}


def frontend_help() -> str:
    """--frontend's help, from the registry."""
    return "; ".join(f"{kind.name}: {kind.help}" for kind in FRONTENDS.values())


def engine_defaults() -> str:
    """Which engine each frontend serves by default, for --engine's help."""
    return ", ".join(f"{kind.default_engine} with --frontend {kind.name}" for kind in FRONTENDS.values())
