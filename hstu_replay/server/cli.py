"""`hstu-replay server export|serve|wait|dump`: the reference server's commands (export, serve and dump need
the [target] extra)."""

from __future__ import annotations

import argparse
import sys

from hstu_replay.errors import ConfigError


def add_commands(groups) -> None:
    server = groups.add_parser("server", aliases=["target"],
                               help="the reference HSTU server: export, serve, wait, dump")
    commands = server.add_subparsers(dest="command", required=True, metavar="COMMAND")

    export = commands.add_parser("export", help="compile the model with AOTInductor into a Triton repository")
    _model_args(export)
    export.set_defaults(func=_export)

    serve = commands.add_parser("serve", help="serve the repository on a real tritonserver (127.0.0.1)")
    _model_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("--cache-metrics-port", type=int, default=8003)
    serve.add_argument("--cache-budget-tokens", type=int, default=3_276_800,
                       help="KV-cache capacity in tokens (published: 102,400 pages of 32)")
    serve.add_argument("--page-tokens", type=int, default=32)
    serve.add_argument("--engine", default="aoti", choices=("aoti", "batched"),
                       help="aoti: the compiled packages, one user at a time; batched: every user of a request "
                            "in one pass over a paged KV pool (the fast path on a GPU; nothing to compile)")
    serve.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                       help="weights and KV cache type (--engine batched; default: the config's)")
    serve.add_argument("--threads", type=int, default=0,
                       help="CPU threads of the model (default 0: OMP_NUM_THREADS if set, else the usable cores "
                            "minus one: beside other work a model on every core slows down several-fold)")
    serve.add_argument("--log-verbose", type=int, default=0)
    serve.add_argument("--tls-cert", default=None, help="PEM server certificate: gRPC then takes TLS only")
    serve.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    serve.add_argument("--https-port", type=int, default=0,
                       help="serve HTTPS here (needs --tls-cert): a TLS-terminating forwarder in front of Triton's "
                            "HTTP port, which then listens on loopback only")
    serve.add_argument("--require-header", default=None, metavar="NAME=VALUE",
                       help="inference requests must carry this header (gRPC: metadata triton-grpc-protocol-NAME), "
                            "checked by tritonserver; the value is never printed")
    serve.set_defaults(func=_serve)

    wait = commands.add_parser("wait", help="until a `server serve` started by a script serves its model")
    wait.add_argument("--http-port", type=int, default=8000)
    wait.add_argument("--pid", type=int, required=True, help="the server's process: fail at once when it is gone")
    wait.add_argument("--log", required=True, help="the server's log: its own error line is quoted on failure")
    wait.add_argument("--timeout", type=float, default=180.0, help="seconds (default 180)")
    wait.set_defaults(func=_wait)

    dump = commands.add_parser("dump", help="write NVIDIA-format reference dumps drawn from a prepared store")
    _model_args(dump)
    dump.add_argument("--store", required=True, help="prepared KuaiRand store")
    dump.add_argument("--out", required=True, help="dump directory to write")
    dump.add_argument("--batches", type=int, default=16)
    dump.add_argument("--batch-size", type=int, default=4)
    dump.add_argument("--candidates", type=int, default=16)
    dump.add_argument("--max-history", type=int, default=None, help="default: the model's maximum")
    dump.add_argument("--min-history", type=int, default=1, help="shortest history drawn (users allowing)")
    dump.add_argument("--dump-seed", type=int, default=0)
    dump.set_defaults(func=_dump)


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repository", default="runs/model_repository", help="Triton model repository")
    parser.add_argument("--config", default="small", help="model config: small, kuairand-1k, kuairand-1k-8l")
    parser.add_argument("--seed", type=int, default=0, help="weights seed")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible")
    return name


def _export(args) -> int:
    from hstu_replay.server.build import export_repository

    export_repository(args.repository, args.config, args.seed, resolve_device(args.device), force=True)
    return 0


def _wait(args) -> int:
    """The readiness rule of `hstu_replay.process`, for a server this process did not start."""
    from pathlib import Path

    from hstu_replay.errors import ServerError
    from hstu_replay.process import SERVED_MODELS, StartFailed, model_ready, models_named, wait_ready
    from hstu_replay.server.watchdog import proc_stat

    def exited() -> str | None:
        return None if proc_stat(args.pid) is not None else f"process {args.pid} is gone"

    try:
        seconds = wait_ready(model_ready(args.http_port), models_named(SERVED_MODELS), exited, Path(args.log),
                             args.timeout)
    except StartFailed as exc:
        raise ServerError(str(exc)) from None
    print(f"hstu-replay: {models_named(SERVED_MODELS)} ready on http port {args.http_port} after {seconds:.1f} s",
          flush=True)
    return 0


def _serve(args) -> int:
    from hstu_replay.server.threads import apply_threads

    if args.threads < 0:
        raise ConfigError(f"--threads {args.threads}: use 0 (the default policy) or a positive count")
    threads = apply_threads(args.threads)  # before torch's first import: OpenMP reads its environment once
    from hstu_replay.server.build import ENGINE_KINDS
    from hstu_replay.server.config import get_config
    from hstu_replay.server.serve import RequiredHeader, ServeOptions, check_ports_free, serve
    from hstu_replay.server.tls_proxy import TlsFiles
    from hstu_replay.server.watchdog import start_watchdog

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together")
    options = ServeOptions(args.host, args.http_port, args.grpc_port, args.metrics_port, args.cache_metrics_port,
                           args.log_verbose, TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert else None,
                           args.https_port,
                           RequiredHeader.parse(args.require_header) if args.require_header is not None else None)
    check_ports_free(options)
    start_watchdog()  # tritonserver and its stubs go when this process goes, even by SIGKILL
    print(f"hstu-replay: model threads {threads}", file=sys.stderr, flush=True)
    device = resolve_device(args.device)
    config = get_config(args.config, args.dtype)
    engines = ENGINE_KINDS[args.engine](args.repository, config, args.seed, args.cache_budget_tokens,
                                        args.page_tokens, device)
    serve(engines, options)
    return 0


def _dump(args) -> int:
    from hstu_replay.server.build import export_repository, load_engines
    from hstu_replay.server.dump import write_reference_dumps

    device = resolve_device(args.device)
    export_repository(args.repository, args.config, args.seed, device)
    engines = load_engines(args.repository, None, 32, device)
    written = write_reference_dumps(engines.uncached, args.store, args.out, args.batches, args.batch_size,
                                    args.candidates, args.max_history, args.dump_seed, args.min_history)
    print(f"hstu-replay: wrote {written} batches to {args.out}", file=sys.stderr)
    return 0
