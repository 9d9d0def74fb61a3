"""`hstu-replay flow l0`: Triton's end-to-end CI test of the HSTU AOTI model in one command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hstu_replay.process import Ports


def add_commands(groups: Any) -> None:
    flow = groups.add_parser("flow", help="NVIDIA's workflows in one command: the L0 CI flow")
    commands = flow.add_subparsers(dest="command", required=True, metavar="COMMAND")

    l0 = commands.add_parser(
        "l0", help="export -> C++ reference dump -> torch_aoti repository -> serve -> client replay checked "
                   "against the C++ reference -> teardown (exit 0 pass, 1 mismatch or server failure, 2 bad input)")
    l0.add_argument("--out", required=True, help="folder for every artifact; emptied of the flow's own entries first")
    l0.add_argument("--config", default="small", help="model config: small, kuairand-1k, kuairand-1k-8l")
    l0.add_argument("--store", default=None, help="prepared KuaiRand store (default: 16 synthetic users under --out)")
    l0.add_argument("--export-from", default=None, metavar="REPOSITORY",
                    help="copy this compiled repository (same config, seed, device) instead of compiling")
    l0.add_argument("--batches", type=int, default=8, help="dump batches: batch 0 is the warm-up, the rest measured")
    l0.add_argument("--batch-size", type=int, default=4)
    l0.add_argument("--candidates", type=int, default=16)
    l0.add_argument("--max-history", type=int, default=None, help="default: the model's maximum")
    l0.add_argument("--seed", type=int, default=0, help="weights seed")
    l0.add_argument("--dump-seed", type=int, default=0)
    l0.add_argument("--tolerance", type=float, default=0.0625, help="max absolute logit difference accepted")
    l0.add_argument("--protocol", default="grpc", choices=("grpc", "http"))
    l0.add_argument("--device", default="auto", help="cpu, cuda or auto")
    l0.add_argument("--threads", type=int, default=0, help="the server model's CPU threads (0: its default policy)")
    l0.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for the model to become ready")
    l0.add_argument("--pause", type=float, default=1.0, help="seconds after the warm-up (NVIDIA's client sleeps 1)")
    l0.add_argument("--ports", default=None, metavar="HTTP,GRPC,METRICS,CACHE_METRICS",
                    help="server ports (default: free ones on 127.0.0.1)")
    l0.set_defaults(func=_l0)


def _l0(args: argparse.Namespace) -> int:
    from hstu_replay.flow.l0 import L0Options, run_l0, summary_line
    from hstu_replay.server.cli import resolve_device

    options = L0Options(
        out=Path(args.out), config=args.config, store=Path(args.store) if args.store else None,
        export_from=Path(args.export_from) if args.export_from else None, batches=args.batches,
        batch_size=args.batch_size, candidates=args.candidates, max_history=args.max_history, seed=args.seed,
        dump_seed=args.dump_seed, tolerance=args.tolerance, protocol=args.protocol, device=resolve_device(args.device),
        threads=args.threads, ready_timeout_s=args.ready_timeout, pause_s=args.pause, ports=_ports(args.ports),
    )
    code, record = run_l0(options)
    print(summary_line(code, record), flush=True)
    return code


def _ports(text: str | None) -> Ports | None:
    from hstu_replay.errors import ConfigError

    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--ports {text!r}: give four port numbers, HTTP,GRPC,METRICS,CACHE_METRICS")
    return Ports(*(int(p) for p in parts))
