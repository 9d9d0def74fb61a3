"""`hstu-replay server export|serve|wait|dump`: the reference server's commands (export, serve and dump need
the [target] extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hstu_replay.arguments import (
    CANDIDATES, DEVICE, DUMP_BATCH_SIZE, DUMP_BATCHES, DUMP_SEED, MODEL_CONFIG, MODEL_MAX_HISTORY, OFFLOAD_CHUNK_TOKENS,
    PAGE_TOKENS, REPOSITORY, STORE, THREADS, WEIGHTS_SEED, Option,
)
from hstu_replay.errors import ConfigError
from hstu_replay.process import long_running

FRONTENDS = ("pytriton", "python-backend", "cpp-backend")
#: the engine the C++ backend serves (its package)
CPP_BACKEND_ENGINE = "batched-aoti"
DEFAULT_ENGINE = "aoti"
#: the engines whose KV cache is one pool of pages
POOLED_ENGINES = ("batched", "batched-aoti")

SERVE_OPTIONS = (
    Option("--host", "address to listen on", "127.0.0.1"),
    Option("--http-port", "Triton's HTTP port", 8000, int),
    Option("--grpc-port", "Triton's gRPC port", 8001, int),
    Option("--metrics-port", "Triton's Prometheus metrics port", 8002, int),
    Option("--cache-metrics-port", "the KV-cache counters' port", 8003, int),
    Option("--cache-budget-tokens", "KV-cache capacity in tokens (published: 102,400 pages of 32)", 3_276_800, int),
    PAGE_TOKENS,
    Option("--reserve-pool", "take the KV pool's whole budget at start, as NVIDIA's runtime takes its primary "
                             "pages (--engine batched or batched-aoti), instead of growing it as it fills: growing "
                             "copies the pool and holds both copies at once (the last growth 1.5 to 2 times the "
                             "pool); reserved, a budget the device cannot hold is refused at start", type=bool),
    Option("--host-budget-tokens", "host tier behind the KV cache, in tokens (0: none); users evicted from the "
                                   "GPU pool keep what was offloaded there (NVIDIA's reference: cpu_cache_gb 1)", 0, int),
    Option("--offload-mode", "when K/V go to the host tier, as NVIDIA's backends do: native (once a whole chunk "
                             "is not yet offloaded, whole chunks) or flexkv (after every forward pass)", "native",
           choices=("native", "flexkv")),
    OFFLOAD_CHUNK_TOKENS,
    Option("--engine", "aoti: the compiled packages, one user at a time; batched: every user of a request in one "
                       "pass over a paged KV pool (the fast path on a GPU; nothing to compile); batched-aoti: that "
                       "pass compiled by AOTInductor into the repository (once; the attention kernel inside on a GPU); "
                       "default aoti, batched-aoti with --frontend cpp-backend",
           choices=("aoti", "batched", "batched-aoti")),
    Option("--dtype", "weights and KV cache type (--engine batched or batched-aoti; default: the config's)",
           choices=("float32", "bfloat16")),
    THREADS,
    Option("--frontend", "pytriton: PyTriton binds the models (one proxy process between tritonserver and the "
                         "engine); python-backend: a Python-backend model repository served by tritonserver "
                         "directly, each model's engine inside its backend stub (no proxy); cpp-backend: our C++ Triton "
                         "backend (cpp/backend, built with CMake once) serving the batched-aoti package, no Python "
                         "in tritonserver's process (its engine: batched-aoti; no host tier)", "pytriton",
           choices=FRONTENDS),
    Option("--log-verbose", "tritonserver's log verbosity", 0, int),
    Option("--tls-cert", "PEM server certificate: gRPC then takes TLS only"),
    Option("--tls-key", "PEM private key of --tls-cert"),
    Option("--https-port", "serve HTTPS here (needs --tls-cert): a TLS-terminating forwarder in front of Triton's "
                           "HTTP port, which then listens on loopback only", 0, int),
    Option("--no-limit-parameters", "leave the model's limits (history items, values, candidates, batch) out of "
                                    "the ranking models' configurations, as NVIDIA's published server does: clients "
                                    "then learn them from refusals", type=bool),
    Option("--require-header", "inference requests must carry this header (gRPC: metadata "
                               "triton-grpc-protocol-NAME), checked by tritonserver; the value is never printed",
           metavar="NAME=VALUE"),
)


def add_commands(groups) -> None:
    server = groups.add_parser("server", aliases=["target"],
                               help="the reference HSTU server: export, serve, wait, dump",
                               epilog="example: hstu-replay server serve --repository runs/model_repository")
    commands = server.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = commands.add_parser("export", help="compile the model with AOTInductor into a Triton repository",
                                  epilog="example: hstu-replay server export --repository runs/model_repository "
                                         "--config small")
    _model_args(export)
    export.set_defaults(func=_export)

    serve = commands.add_parser("serve", help="serve the repository on a real tritonserver (127.0.0.1)",
                                 epilog="example: hstu-replay server serve --repository runs/model_repository "
                                        "--grpc-port 8001 --http-port 8000")
    _model_args(serve)
    for option in SERVE_OPTIONS:
        option.add_to(serve)
    serve.set_defaults(func=_serve)

    wait = commands.add_parser("wait", help="until a `server serve` started by a script serves its model",
                                epilog="example: hstu-replay server wait --http-port 8000 --pid 4242 --log server.log "
                                       "--timeout 60")
    wait.add_argument("--http-port", type=int, default=8000)
    wait.add_argument("--pid", type=int, required=True, help="the server's process: fail at once when it is gone")
    wait.add_argument("--log", required=True, help="the server's log: its own error line is quoted on failure")
    wait.add_argument("--timeout", type=float, default=180.0, help="seconds (default 180)")
    wait.set_defaults(func=_wait)

    dump = commands.add_parser("dump", help="write NVIDIA-format reference dumps drawn from a prepared store",
                                epilog="example: hstu-replay server dump --repository runs/model_repository "
                                       "--store runs/store --out runs/dumps")
    _model_args(dump)
    STORE.add_to(dump, required=True, metavar=None)
    Option("--out", "dump directory to write").add_to(dump, required=True)
    DUMP_BATCHES.add_to(dump)
    DUMP_BATCH_SIZE.add_to(dump)
    CANDIDATES.add_to(dump)
    MODEL_MAX_HISTORY.add_to(dump)
    Option("--min-history", "shortest history drawn (users allowing)", 1, int).add_to(dump)
    DUMP_SEED.add_to(dump)
    dump.set_defaults(func=_dump)


def _model_args(parser: argparse.ArgumentParser) -> None:
    for option in (REPOSITORY, MODEL_CONFIG, WEIGHTS_SEED, DEVICE):
        option.add_to(parser)


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible")
    return name


@long_running
def _export(args) -> int:
    from hstu_replay.server.build import export_repository

    export_repository(args.repository, args.config, args.seed, resolve_device(args.device), force=True)
    return 0


def _wait(args) -> int:
    """The readiness rule of `hstu_replay.process`, for a server this process did not start."""
    from pathlib import Path

    from hstu_replay.errors import ServerError
    from hstu_replay.inspection import is_alive
    from hstu_replay.process import SERVED_MODELS, StartFailed, model_ready, models_named, wait_ready

    def exited() -> str | None:
        return None if is_alive(args.pid) else f"process {args.pid} is gone"

    try:
        seconds = wait_ready(model_ready(args.http_port), models_named(SERVED_MODELS), exited, Path(args.log),
                             args.timeout)
    except StartFailed as exc:
        raise ServerError(str(exc)) from None
    print(f"hstu-replay: {models_named(SERVED_MODELS)} ready on http port {args.http_port} after {seconds:.1f} s",
          flush=True)
    return 0


@long_running
def _serve(args) -> int:
    from hstu_replay.server.threads import apply_threads

    if args.threads < 0:
        raise ConfigError(f"--threads {args.threads}: use 0 (the default policy) or a positive count")
    threads = apply_threads(args.threads)  # before torch's first import: OpenMP reads its environment once
    from hstu_replay.server.build import ENGINE_KINDS, prepare_engine
    from hstu_replay.server.model_config import get_config
    from hstu_replay.server.host_tier import HostTierOptions, OffloadMode
    from hstu_replay.server.serve import RequiredHeader, ServeOptions, check_ports_free, serve
    from hstu_replay.server.tls_proxy import TlsFiles
    from hstu_replay.server.watchdog import start_watchdog

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.engine is None:  # the engine the frontend serves by default
        args.engine = CPP_BACKEND_ENGINE if args.frontend == "cpp-backend" else DEFAULT_ENGINE
    if args.frontend == "cpp-backend":
        _check_cpp_backend(args)
    if args.reserve_pool and args.engine not in POOLED_ENGINES:
        raise ConfigError(f"--reserve-pool: --engine {args.engine} keeps each user's K/V apart, in no pool; use "
                          f"--engine {' or '.join(POOLED_ENGINES)}")
    host = HostTierOptions(args.host_budget_tokens, OffloadMode(args.offload_mode), args.offload_chunk_tokens)
    options = ServeOptions(args.host, args.http_port, args.grpc_port, args.metrics_port, args.cache_metrics_port,
                           args.log_verbose, TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert else None,
                           args.https_port,
                           RequiredHeader.parse(args.require_header) if args.require_header is not None else None,
                           publish_limits=not args.no_limit_parameters)
    check_ports_free(options)
    start_watchdog()  # tritonserver and its stubs go when this process goes, even by SIGKILL
    print(f"hstu-replay: model threads {threads}", file=sys.stderr, flush=True)
    device = resolve_device(args.device)
    config = get_config(args.config, args.dtype)
    # the C++ backend first: a missing compiler or CMake is said before the package's compile
    library = _cpp_backend_library() if args.frontend == "cpp-backend" else None
    prepare_engine(args.engine, args.repository, config, args.seed, args.page_tokens, device)
    if library is not None:
        from hstu_replay.server.build import batched_step_path
        from hstu_replay.server.cpp_backend import CppBackendSettings, serve_cpp

        package = batched_step_path(args.repository, config, args.seed, args.page_tokens, device)
        serve_cpp(CppBackendSettings(config, package, args.cache_budget_tokens, args.page_tokens, host,
                                     args.reserve_pool), options, library)
        return 0
    if args.frontend == "python-backend":
        from hstu_replay.server.python_backend import BackendSettings, serve_native

        serve_native(BackendSettings("cached", "", args.engine, str(Path(args.repository).resolve()), args.config, args.dtype,
                                     args.seed, args.cache_budget_tokens, args.page_tokens, device, args.host,
                                     args.cache_metrics_port, "", host.budget_tokens, host.mode.value,
                                     host.chunk_tokens, args.reserve_pool), options)
        return 0
    engines = ENGINE_KINDS[args.engine](args.repository, config, args.seed, args.cache_budget_tokens,
                                        args.page_tokens, device, host, args.reserve_pool)
    serve(engines, options)
    return 0


def _cpp_backend_library() -> Path:
    from hstu_replay.server.cpp_backend import build_backend

    return build_backend()


def _check_cpp_backend(args) -> None:
    """What the C++ backend cannot serve, refused in one line before any work."""
    if args.engine != CPP_BACKEND_ENGINE:
        raise ConfigError(f"--frontend cpp-backend serves --engine {CPP_BACKEND_ENGINE} only (got --engine {args.engine})")


@long_running
def _dump(args) -> int:
    from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS
    from hstu_replay.data.store import open_store
    from hstu_replay.server.build import export_repository, load_engines
    from hstu_replay.server.dump import write_reference_dumps

    open_store(args.store)  # a missing or corrupt store is named before the export
    device = resolve_device(args.device)
    export_repository(args.repository, args.config, args.seed, device)
    engines = load_engines(args.repository, None, DEFAULT_PAGE_TOKENS, device)
    written = write_reference_dumps(engines.uncached, args.store, args.out, args.batches, args.batch_size,
                                    args.candidates, args.max_history, args.dump_seed, args.min_history)
    print(f"hstu-replay: wrote {written} batches to {args.out}", file=sys.stderr)
    return 0
