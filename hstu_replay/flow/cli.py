"""`hstu-replay flow l0`: Triton's end-to-end CI test of the HSTU AOTI model in one command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hstu_replay.arguments import (
    CANDIDATES, DEVICE, DUMP_BATCH_SIZE, DUMP_BATCHES, DUMP_SEED, MODEL_CONFIG, MODEL_MAX_HISTORY, STORE, THREADS,
    TOLERANCE, TRITON_PROTOCOL, WEIGHTS_SEED, Option, numbers,
)
from hstu_replay.process import Ports, long_running
from hstu_replay.server.frontends import FRONTENDS


def add_commands(groups: Any) -> None:
    flow = groups.add_parser("flow", help="NVIDIA's workflows in one command: the L0 CI flow",
                             epilog="example: hstu-replay flow l0 --out runs/l0")
    commands = flow.add_subparsers(dest="command", required=True, metavar="COMMAND")

    l0 = commands.add_parser(
        "l0", help="export -> C++ reference dump -> torch_aoti repository -> serve -> client replay checked "
                   "against the C++ reference -> teardown (exit 0 pass, 1 mismatch or server failure, 2 bad input)",
        epilog="example: hstu-replay flow l0 --out runs/l0 --config small --store runs/store")
    Option("--out", "folder for every artifact; emptied of the flow's own entries first").add_to(l0, required=True)
    MODEL_CONFIG.add_to(l0)
    STORE.add_to(l0, help="prepared KuaiRand store (default: 16 synthetic users under --out)", metavar=None)
    Option("--export-from", "copy this compiled repository (same config, seed, device) instead of compiling",
           metavar="REPOSITORY").add_to(l0)
    DUMP_BATCHES.add_to(l0, default=8)  # one warm-up and seven measured batches keep the flow short
    DUMP_BATCH_SIZE.add_to(l0)
    CANDIDATES.add_to(l0)
    MODEL_MAX_HISTORY.add_to(l0)
    WEIGHTS_SEED.add_to(l0)
    DUMP_SEED.add_to(l0)
    TOLERANCE.add_to(l0)
    TRITON_PROTOCOL.but(flag="--protocol", choices=("grpc", "http")).add_to(l0)
    DEVICE.add_to(l0)
    THREADS.add_to(l0, help="the server model's CPU threads (0: its default policy)")
    Option("--ready-timeout", "seconds for the model to become ready", 300.0, float).add_to(l0)
    Option("--pause", "seconds after the warm-up (NVIDIA's client sleeps 1)", 1.0, float).add_to(l0)
    Option("--ports", "server ports (default: free ones on 127.0.0.1)",
           metavar="HTTP,GRPC,METRICS,CACHE_METRICS").add_to(l0)
    Option("--frontend", "how tritonserver reaches the model: pytriton, python-backend or cpp-backend (our C++ "
           "Triton backend, the batched AOTInductor engine)", "pytriton",
           choices=tuple(FRONTENDS)).add_to(l0)
    l0.set_defaults(func=_l0)


@long_running
def _l0(args: argparse.Namespace) -> int:
    from hstu_replay.flow.l0 import L0Options, run_l0, summary_line
    from hstu_replay.server.cli import resolve_device

    options = L0Options(
        out=Path(args.out), config=args.config, store=Path(args.store) if args.store else None,
        export_from=Path(args.export_from) if args.export_from else None, batches=args.batches,
        batch_size=args.batch_size, candidates=args.candidates, max_history=args.max_history, seed=args.seed,
        dump_seed=args.dump_seed, tolerance=args.tolerance, protocol=args.protocol, device=resolve_device(args.device),
        threads=args.threads, ready_timeout_s=args.ready_timeout, pause_s=args.pause, ports=_ports(args.ports),
        frontend=args.frontend,
    )
    code, record = run_l0(options)
    print(summary_line(code, record), flush=True)
    return code


def _ports(text: str | None) -> Ports | None:
    if text is None:
        return None
    return Ports(*numbers("--ports", text, 0, integral=True, count=4, digits=True,
                          form="four port numbers, HTTP,GRPC,METRICS,CACHE_METRICS"))
