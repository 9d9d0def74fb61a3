"""`hstu-replay protocol run`: NVIDIA's published benchmark protocol against a running server.

Every option is read as text and checked here, before any request: a bad one is one line and
exit 2. Exit 0: done, every checked answer within tolerance; 1: some answer differed from its
reference; 2: bad options or data, or a server or model that cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from hstu_replay.arguments import (
    CANDIDATES, DUMP_DIR, MAX_HISTORY, MAX_VALUES, SCALING_BATCH_SIZES, STORE, TOLERANCE, TRITON_PROTOCOL,
    TRITON_URL, Option, batch_number, batch_numbers, number,
)
from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.errors import ConfigError, InputError, LimitError
from hstu_replay.interface import INTERFACES, Limits
from hstu_replay.protocol.cases import Case, make_cases, users_from_dumps, users_from_store
from hstu_replay.protocol.page import render_protocol_html
from hstu_replay.protocol.passes import Caller, PassResult, run_passes
from hstu_replay.protocol.tables import build_protocol_report, render_text
from hstu_replay.output.files import atomic_write, json_bytes
from hstu_replay.process import long_running

DEFAULT_MODELS = "hstu_model,hstu_gr_ranking,hstu_gr_ranking_kvcache"
SCALING_MODEL = "hstu_gr_ranking_kvcache"
JSON_NAME, HTML_NAME = "protocol.json", "protocol.html"


def add_commands(groups) -> None:
    protocol = groups.add_parser("protocol", help="NVIDIA's benchmark protocol against a running server",
                                 epilog="example: hstu-replay protocol run --triton-url 127.0.0.1:8001 "
                                        "--dump-dir runs/dumps")
    actions = protocol.add_subparsers(dest="protocol_command", required=True, metavar="ACTION")
    p = actions.add_parser("run", help="NVIDIA's benchmark protocol: backend comparison and batch-size scaling",
                           description=__doc__.splitlines()[0],
                           epilog="example: hstu-replay protocol run --triton-url 127.0.0.1:8001 "
                                  "--dump-dir runs/dumps --out runs/protocol")
    TRITON_URL.add_to(p, text=True)
    TRITON_PROTOCOL.add_to(p, text=True)
    DUMP_DIR.add_to(p, help="NVIDIA-format dump directory (answers checked against its logits)")
    STORE.add_to(p, help="prepared store: each user's latest events, no reference logits")
    Option("--models", "models measured at the backend batch", DEFAULT_MODELS).add_to(p)
    Option("--backend-batch", "batch size of the backend comparison (default %(default)s, NVIDIA's)", 2
           ).add_to(p, text=True)
    SCALING_BATCH_SIZES.add_to(p, help=f"batch sizes of the {SCALING_MODEL} scaling table")
    Option("--cases", "measured calls per pass (default: as many as the users allow)", "").add_to(p)
    Option("--repeats", "passes of a model without cache, averaged (default %(default)s, NVIDIA's)", 3
           ).add_to(p, text=True)
    Option("--sleep", "seconds slept after the warm-up call, not timed", 1.0).add_to(p, text=True)
    CANDIDATES.add_to(p, help="candidates per user, --store", text=True)
    MAX_HISTORY.add_to(p, help="longest history in items, --store", text=True)
    MAX_VALUES.add_to(p, text=True)
    TOLERANCE.add_to(p, text=True)
    Option("--hardware", "what the server runs on, printed beside our figures (e.g. 'NVIDIA H200')",
           "hardware not named").add_to(p)
    Option("--timeout", "seconds before one call counts as failed", 120).add_to(p, text=True)
    Option("--out", "folder for protocol.json and protocol.html", "").add_to(p)
    p.set_defaults(func=_protocol)


@dataclass(frozen=True)
class Settings:
    """The command's options, checked."""

    options: ClientOptions
    models: tuple[str, ...]
    runs: tuple[tuple[str, int], ...]  # (model, batch size), in the order they are measured
    backend_batch: int
    batch_sizes: tuple[int, ...]
    cases: int | None  # cases per run, warm-up included; None: as many as the users allow
    repeats: int
    sleep_s: float
    tolerance: float
    limits: Limits
    out: Path | None


def _settings(args: argparse.Namespace) -> Settings:
    if (args.dump_dir is None) == (args.store is None):
        raise ConfigError("give exactly one of --dump-dir DIR or --store STORE")
    known = {i.model_name for i in INTERFACES.values()}
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if not models or any(m not in known for m in models):
        raise ConfigError(f"--models {args.models!r}: use some of {', '.join(sorted(known))}")
    limits = Limits(max_values=number("--max-values", args.max_values, 1, integral=True))
    backend_batch = batch_number("--backend-batch", args.backend_batch, limits)
    batch_sizes = (tuple(sorted(set(batch_numbers("--batch-sizes", args.batch_sizes, limits))))
                   if SCALING_MODEL in models else ())
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(f"--out {args.out!r}: exists and is not a folder")
    timeout = number("--timeout", args.timeout, 0.1)
    return Settings(
        options=ClientOptions(url=args.triton_url, protocol=args.triton_protocol, timeout_s=timeout),
        models=models,
        runs=tuple([(m, backend_batch) for m in models]
                   + [(SCALING_MODEL, b) for b in batch_sizes if b != backend_batch]),
        backend_batch=backend_batch, batch_sizes=batch_sizes,
        cases=number("--cases", args.cases, 1, integral=True) + 1 if args.cases else None,
        repeats=number("--repeats", args.repeats, 1, 100, integral=True),
        sleep_s=number("--sleep", args.sleep, 0, 60),
        tolerance=number("--tolerance", args.tolerance, 0),
        limits=limits, out=out,
    )


def _plan(args: argparse.Namespace, s: Settings) -> tuple[int, dict[tuple[str, int], list[Case]]]:
    """Users and every run's cases, laid out before any request (bad data: exit 2)."""
    try:
        if args.dump_dir is not None:
            users = users_from_dumps(args.dump_dir)
        else:
            candidates = number("--candidates", args.candidates, 1, s.limits.max_candidates, integral=True)
            history = number("--max-history", args.max_history, 1, s.limits.max_history, integral=True)
            users = users_from_store(args.store, candidates, history)
        return len(users), {run: make_cases(users, run[1], s.cases, s.limits) for run in s.runs}
    except (InputError, LimitError) as exc:
        raise ConfigError(str(exc)) from None


@long_running
def _protocol(args: argparse.Namespace) -> int:
    s = _settings(args)
    users, planned = _plan(args, s)
    run = {"url": args.triton_url, "protocol": args.triton_protocol, "hardware": args.hardware,
           "source": {"dump_dir": args.dump_dir} if args.dump_dir else
           {"store": args.store, "candidates": args.candidates, "max_history": args.max_history},
           "users": users, "models": list(s.models), "backend_batch": s.backend_batch,
           "batch_sizes": list(s.batch_sizes), "measured_cases": {str(b): len(planned[(m, b)]) - 1 for m, b in s.runs},
           "warmup_calls": 1, "sleep_s": s.sleep_s, "repeats": s.repeats, "tolerance": s.tolerance}

    def report(passes: list[PassResult], complete: bool) -> dict:
        return build_protocol_report(passes, run | {"complete": complete}, backend_batch=s.backend_batch,
                                     scaling_model=SCALING_MODEL)

    # connect to every model first (one line if one is missing or not an HSTU model), then measure;
    # what is measured so far is written after each run, so an interrupted run keeps it
    clients = {m: TritonClient(replace(s.options, model=m)) for m in s.models}
    passes: list[PassResult] = []
    try:
        bindings = {m: c.connect() for m, c in clients.items()}
        run["interfaces"] = {m: b.interface.name for m, b in bindings.items()}
        run["reports_hits"] = {m: b.reports_hits for m, b in bindings.items()}
        for model, batch in s.runs:
            client = clients[model]
            caller = Caller(client.infer, lambda c=client, m=model: _served(c, m))
            passes += run_passes(caller, model, planned[(model, batch)], bindings[model].interface.uses_cache,
                                 s.repeats, s.sleep_s, s.tolerance)
            print(f"measured {model} at batch {batch}", file=sys.stderr, flush=True)
            _write(report(passes, False), s.out)
    finally:
        for c in clients.values():
            c.close()
    final = report(passes, True)
    print(render_text(final))
    if s.out is not None:
        _write(final, s.out)
        print(f"wrote {s.out / JSON_NAME} and {s.out / HTML_NAME}")
    mismatches = sum(p.mismatches for p in passes)
    if mismatches:
        print(f"hstu-replay: {mismatches} answers differed from their reference", file=sys.stderr)
        return 1
    return 0


def _write(report: dict, out: Path | None) -> None:
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        # the page first: once protocol.json is there (what a watcher waits for), both are
        atomic_write(out / HTML_NAME, render_protocol_html(report).encode())
        atomic_write(out / JSON_NAME, json_bytes(report))


def _served(client, model: str) -> int | None:
    """Triton's count of the model's successful requests so far (None where statistics are closed)."""
    for entry in client.server_statistics(model).get("model_stats", []):
        if entry.get("name") == model:
            return int(entry.get("inference_stats", {}).get("success", {}).get("count", 0))
    return None
