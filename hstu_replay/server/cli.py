"""`hstu-replay server export|serve|wait|dump`: the reference server's commands (export, serve and dump need
the [target] extra)."""

from __future__ import annotations

import argparse
import sys

from hstu_replay.arguments import (
    CANDIDATES, DEVICE, DUMP_BATCH_SIZE, DUMP_BATCHES, DUMP_SEED, MODEL_CONFIG, MODEL_MAX_HISTORY, OFFLOAD_CHUNK_TOKENS,
    PAGE_TOKENS, REPOSITORY, STORE, THREADS, WEIGHTS_SEED, Option,
)
from hstu_replay.cache_ledger import DEFAULT_PAGE_TOKENS, DEFAULT_POOL_TOKENS, PUBLISHED_POOL_PAGES
from hstu_replay.errors import ConfigError
from hstu_replay.interface import DEFAULT_CACHE_METRICS_PORT, DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT
from hstu_replay.process import long_running
from hstu_replay.server.frontends import FRONTENDS, Engine, Frontend, engine_defaults, frontend_help

SERVE_OPTIONS = (
    Option("--host", "address to listen on", "127.0.0.1"),
    Option("--http-port", "Triton's HTTP port", DEFAULT_HTTP_PORT, int),
    Option("--grpc-port", "Triton's gRPC port", DEFAULT_GRPC_PORT, int),
    Option("--metrics-port", "Triton's Prometheus metrics port", DEFAULT_METRICS_PORT, int),
    Option("--cache-metrics-port", "the KV-cache counters' port", DEFAULT_CACHE_METRICS_PORT, int),
    Option("--cache-budget-tokens", f"KV-cache capacity in tokens (published: {PUBLISHED_POOL_PAGES:,} pages of "
           f"{DEFAULT_PAGE_TOKENS})", DEFAULT_POOL_TOKENS, int),
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
                       f"default: the frontend's, said when taken ({engine_defaults()})",
           choices=tuple(Engine)),
    Option("--dtype", "weights and KV cache type (--engine batched or batched-aoti; default: the config's)",
           choices=("float32", "bfloat16")),
    THREADS,
    Option("--frontend", frontend_help(), Frontend.PYTRITON.value, choices=tuple(FRONTENDS)),
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
    wait.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
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
    from hstu_replay.server.serve_config import ServeConfig
    from hstu_replay.server.threads import apply_threads

    config = ServeConfig.from_args(args)  # every refusal before any work
    threads = apply_threads(config.engine.threads)  # before torch's first import: OpenMP reads its environment once
    from hstu_replay.server.model_config import get_config
    from hstu_replay.server.serve import check_ports_free
    from hstu_replay.server.watchdog import start_watchdog

    check_ports_free(config.network)
    start_watchdog()  # tritonserver and its stubs go when this process goes, even by SIGKILL
    if config.engine.defaulted:
        print(f"hstu-replay: --engine {config.engine.kind}, the default of --frontend {config.frontend} (--engine "
              "chooses another)", file=sys.stderr, flush=True)
    print(f"hstu-replay: model threads {threads}", file=sys.stderr, flush=True)
    device = resolve_device(config.engine.device)
    FRONTENDS[config.frontend].serve(config, get_config(config.engine.config, config.engine.dtype), device)
    return 0


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
