"""The L0 flow: Triton's end-to-end CI test of the HSTU AOTI model, with this project's parts.

    build the C++ replay -> export (AOTInductor packages, torch_aoti repository) -> data ->
    dump inputs -> reference logits written by the C++ replay -> serve (child process, loopback,
    wait for the model) -> client replay (warm-up, pass 1 cold, pass 2 cached, every response
    checked) -> teardown (always) -> summary.json and one line

Every artifact lives under --out, which holds a marker file: a rerun empties the flow's own
entries first, and a non-empty folder without the marker is refused. Teardown runs in a
`finally`, on a failure, Ctrl-C or SIGTERM too, and must leave no process or port behind.
Exit status: 0 pass; 1 a mismatch, a server that failed, or an unclean teardown; 2 bad input.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hstu_replay.arguments import batch_number
from hstu_replay.errors import ConfigError, HstuReplayError, opened_by_option
from hstu_replay.process import PORT_MAX, Ports, ServerProcess, StartFailed, Teardown
from hstu_replay.verify import DEFAULT_TOLERANCE

MARKER = ".hstu-replay-flow"
#: Entries of --out the flow writes (and empties on a rerun); nothing else there is touched.
ENTRIES = ("model_repository", "data", "dump", "logs", "client.jsonl", "summary.json")
SYNTHETIC_USERS = 16


@dataclass(frozen=True)
class L0Options:
    out: Path
    config: str = "small"
    store: Path | None = None  # a prepared store; default: synthetic users written under out/data
    export_from: Path | None = None  # copy this compiled repository instead of compiling
    batches: int = 8  # dump batches: one warm-up, the rest measured
    batch_size: int = 4
    candidates: int = 16
    max_history: int | None = None
    seed: int = 0  # weights
    dump_seed: int = 0
    tolerance: float = DEFAULT_TOLERANCE
    protocol: str = "grpc"
    device: str = "cpu"
    threads: int = 0
    ready_timeout_s: float = 300.0
    pause_s: float = 1.0  # after the warm-up, as NVIDIA's client sleeps
    ports: Ports | None = None  # default: free ports on 127.0.0.1
    frontend: str = "pytriton"  # how tritonserver reaches the model (server serve --frontend)


@dataclass(frozen=True)
class Layout:
    out: Path

    @property
    def repository(self) -> Path:
        return self.out / "model_repository"

    @property
    def data(self) -> Path:
        return self.out / "data"

    @property
    def dump(self) -> Path:
        return self.out / "dump"

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def records(self) -> Path:
        return self.out / "client.jsonl"

    @property
    def summary(self) -> Path:
        return self.out / "summary.json"


@dataclass
class FlowRecord:
    """What the flow did so far; written as summary.json whatever happens."""

    options: L0Options
    steps: dict[str, float] = field(default_factory=dict)  # step -> seconds, in order
    status: str = "running"
    failed_step: str | None = None
    error: str | None = None
    facts: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.options).items()}
        options["ports"] = vars(self.options.ports) if self.options.ports else None
        return {"flow": "l0", "status": self.status, "failed_step": self.failed_step, "error": self.error,
                "steps": self.steps, "options": options, **self.facts}


class FlowFailed(HstuReplayError):
    """A step failed: a mismatch, a server that did not start or stopped answering (exit 1)."""


def check_options(options: L0Options) -> None:
    """Everything that makes bad input, before anything is written (ConfigError, exit 2)."""
    from hstu_replay.server.model_config import get_config

    config = get_config(options.config)
    if options.batches < 2:
        raise ConfigError(f"--batches {options.batches}: needs a warm-up batch and at least one measured batch (>= 2)")
    batch_number("--batch-size", options.batch_size)
    if not 1 <= options.candidates <= config.max_candidates:
        raise ConfigError(f"--candidates {options.candidates}: the {config.name} model takes 1..{config.max_candidates}")
    if options.max_history is not None and options.max_history < 1:
        raise ConfigError(f"--max-history {options.max_history}: use a positive number of items")
    if not (math.isfinite(options.tolerance) and options.tolerance >= 0):
        raise ConfigError(f"--tolerance {options.tolerance}: use a finite number >= 0")
    if not options.ready_timeout_s > 0:
        raise ConfigError(f"--ready-timeout {options.ready_timeout_s}: use a positive number of seconds")
    if not (math.isfinite(options.pause_s) and options.pause_s >= 0):
        raise ConfigError(f"--pause {options.pause_s}: use a number of seconds >= 0")
    if options.threads < 0:
        raise ConfigError(f"--threads {options.threads}: use 0 (the default policy) or a positive count")
    if options.ports and not all(0 < p <= PORT_MAX for p in options.ports.all()):
        raise ConfigError(f"ports {list(options.ports.all())}: use 1..{PORT_MAX}")
    _check_out(options.out)
    for name, path in (("--store", options.store), ("--export-from", options.export_from)):
        if path is not None and path.resolve().is_relative_to(options.out.resolve()):
            raise ConfigError(f"{name} {path}: lies inside --out {options.out}, which the flow empties; copy it elsewhere")
    if options.store is not None:
        from hstu_replay.data.store import open_store

        open_store(options.store)
    if options.export_from is not None:
        _check_export_from(options)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ConfigError(f"--out {out}: a non-empty folder the flow did not make (no {MARKER}); "
                          f"give an empty or new folder")


def _check_export_from(options: L0Options) -> None:
    from hstu_replay.server.repository import RepositoryLayout, read_meta

    layout = RepositoryLayout(options.export_from)
    if not layout.is_complete():
        raise ConfigError(f"--export-from {options.export_from}: no compiled repository there")
    meta = opened_by_option("--export-from", options.export_from, lambda _: read_meta(layout))
    from hstu_replay.server.build import stale_reason

    reason = stale_reason(meta, options.config, options.seed, options.device)
    if reason is not None:
        raise ConfigError(f"--export-from {options.export_from}: {reason}; export it again")


def prepare_out(out: Path) -> Layout:
    """Mark --out as the flow's and empty the flow's own entries (checked by `check_options`)."""
    _check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("hstu-replay flow l0: this folder's entries are replaced by each run\n")
    for name in ENTRIES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    layout = Layout(out)
    layout.logs.mkdir()
    return layout


def run_l0(options: L0Options) -> tuple[int, FlowRecord]:
    """The whole flow; returns the exit status and the record (also in summary.json)."""
    check_options(options)
    layout = prepare_out(options.out)
    record = FlowRecord(options)
    server: ServerProcess | None = None
    try:
        with _sigterm_as_interrupt():
            try:
                _prepare(options, layout, record)
                server = _server(options, layout)
                record.facts["server"] = {"ports": vars(server.ports), "log": str(server.log)}
                with _step(record, "serve"):
                    server.start()
                    _wait_ready(options, server, record)
                _replay(options, layout, server, record)
                record.status = "pass"
            finally:
                if server is not None:
                    _teardown(server, record)
    except KeyboardInterrupt:
        record.status = "interrupted"
        _write_summary(layout, record)
        raise
    except ConfigError as exc:
        record.status, record.error = "bad-input", str(exc)
        _write_summary(layout, record)
        raise
    except HstuReplayError as exc:  # a mismatch, a server that failed, a step that could not run
        record.status, record.error = "fail", str(exc)
    if record.status == "pass" and not record.facts.get("teardown", {}).get("clean", True):
        record.status, record.failed_step = "fail", "teardown"
        record.error = f"left behind after teardown: {', '.join(record.facts['teardown']['left'])}"
    _write_summary(layout, record)
    return (0 if record.status == "pass" else 1), record


@contextmanager
def _step(record: FlowRecord, name: str) -> Iterator[None]:
    record.failed_step = name
    started = time.perf_counter()
    try:
        yield
    finally:
        record.steps[name] = round(time.perf_counter() - started, 3)
    record.failed_step = None


def _prepare(options: L0Options, layout: Layout, record: FlowRecord) -> None:
    from hstu_replay.interface import NOCACHE
    import hstu_replay.cpp_replay.replay as cpp_replay
    from hstu_replay.server.repository import RepositoryLayout

    with _step(record, "build"):
        cpp_replay.build()
    with _step(record, "export"):
        if options.export_from is not None:
            shutil.copytree(options.export_from, layout.repository)
            record.facts["export"] = {"copied_from": str(options.export_from)}
        else:
            from hstu_replay.server.build import export_repository

            meta = export_repository(layout.repository, options.config, options.seed, options.device, force=True)
            record.facts["export"] = {"compile_seconds": meta.compile_seconds, "torch": meta.torch_version}
    with _step(record, "data"):
        store = options.store or _synthetic_store(layout, options.dump_seed)
        record.facts["store"] = str(store)
    with _step(record, "dump"):
        from hstu_replay.server.model_config import get_config
        from hstu_replay.server.dump import draw_requests, write_dump_inputs

        requests = draw_requests(get_config(options.config), store, options.batches, options.batch_size,
                                 options.candidates, options.max_history, options.dump_seed)
        write_dump_inputs(requests, layout.dump)
    with _step(record, "reference"):
        package = RepositoryLayout(layout.repository).package(NOCACHE)
        written = cpp_replay.produce_reference(package, layout.dump)
        record.facts["reference"] = {"writer": cpp_replay.BINARY_NAME, "package": str(package), "batches": written}


def _synthetic_store(layout: Layout, seed: int) -> Path:
    from hstu_replay.data.prepare import prepare
    from hstu_replay.data.synth import synthesize

    synthesize(layout.data / "raw", users=SYNTHETIC_USERS, seed=seed, events_per_user_scale=0.1)
    prepare(layout.data / "raw", layout.data / "store")
    return layout.data / "store"


def _server(options: L0Options, layout: Layout) -> ServerProcess:
    """The server process, not started yet."""
    return ServerProcess.serve(layout.repository, layout.logs / "server.log", options.ports, "--config", options.config,
                               "--seed", str(options.seed), "--device", options.device,
                               "--threads", str(options.threads), "--frontend", options.frontend,
                               ready_timeout_s=options.ready_timeout_s)


def _wait_ready(options: L0Options, server: ServerProcess, record: FlowRecord) -> None:
    try:
        ready = server.wait_ready()
    except StartFailed as exc:
        raise FlowFailed(str(exc)) from None
    record.facts["server"]["ready_seconds"] = round(ready, 3)


def _replay(options: L0Options, layout: Layout, server: ServerProcess, record: FlowRecord) -> None:
    from hstu_replay.client.triton import ClientOptions, TritonClient
    from hstu_replay.dumps.reader import read_dump
    from hstu_replay.flow.client_pass import replay_dump
    from hstu_replay.interface import KVCACHE

    with _step(record, "client"):
        batches = read_dump(layout.dump)
        port = server.ports.grpc if options.protocol == "grpc" else server.ports.http
        client = TritonClient(ClientOptions(url=f"127.0.0.1:{port}", protocol=options.protocol,
                                            model=KVCACHE.model_name))
        try:
            binding = client.connect()
            if binding.interface is not KVCACHE:
                raise FlowFailed(f"model {KVCACHE.model_name} serves the {binding.interface.name} interface")
            with layout.records.open("wb") as records:
                outcome = replay_dump(client, batches, options.tolerance, options.pause_s, records)
        finally:
            client.close()
        record.facts["client"] = {
            "records": str(layout.records), "tolerance": options.tolerance, "reference": "compiled_logits (C++)",
            "warmup": outcome.warmup.summary(), "passes": [p.summary() for p in outcome.passes],
            "failed": [c.describe() for c in outcome.failed],
        }
        record.facts["warnings"] = hit_warnings(record.facts["client"]["passes"])
        if not outcome.ok:
            failed = outcome.failed
            detail = f"only {len(outcome.passes)} of 2 passes ran"
            if failed:
                detail = failed[0].describe() + (f" (+{len(failed) - 1} more)" if len(failed) > 1 else "")
            down = server.failure()
            raise FlowFailed(f"{detail}; {down}" if down else detail)


def hit_warnings(passes: list[dict]) -> list[str]:
    """Where the server reports its hits and they are not what the passes are named for (all
    computed in pass 1, all reused in pass 2: NVIDIA's convention), say so: a flagged figure."""
    expected = {"cold": 0.0, "cached": 1.0}
    return [f"pass {p['phase']}: the server reports hit ratio {p['hit_ratio']:.3f}, not {expected[p['phase']]:.0f}"
            for p in passes if p["hit_ratio"] is not None and p["hit_ratio"] != expected[p["phase"]]]


def _teardown(server: ServerProcess, record: FlowRecord) -> Teardown:
    if server.process is not None:  # recorded here, where it is known however the run ended
        record.facts["server"]["pid"] = server.process.pid
    started = time.perf_counter()
    teardown = server.stop()
    record.steps["teardown"] = round(time.perf_counter() - started, 3)
    record.facts["teardown"] = {"clean": teardown.clean, "server_exit": teardown.exit_code,
                                "forced": list(teardown.forced), "left": list(teardown.left),
                                "processes": sorted(server.family), "ports": list(server.own_ports)}
    return teardown


def _write_summary(layout: Layout, record: FlowRecord) -> None:
    partial = layout.summary.with_suffix(".partial")
    partial.write_text(json.dumps(record.as_json(), indent=2, default=str) + "\n")
    partial.replace(layout.summary)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the teardown in `finally` runs."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous: Callable | int | None = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def summary_line(code: int, record: FlowRecord) -> str:
    """The flow's one line: verdict, what was checked, the passes, teardown, where the summary is."""
    client = record.facts.get("client", {})
    teardown = record.facts.get("teardown")
    tail = (f"teardown {'clean' if teardown['clean'] else 'NOT clean'}; " if teardown else "") + \
        f"summary {record.options.out / 'summary.json'}"
    if code != 0:
        return f"hstu-replay flow l0: FAIL at {record.failed_step or 'client'}: {record.error}; {tail}"
    passes = client["passes"]
    worst = max([client["warmup"]["max_abs_diff"]] + [p["max_abs_diff"] for p in passes])
    checked = client["warmup"]["verified"] + sum(p["verified"] for p in passes)
    phases = ", ".join(f"pass {i + 1} {p['phase']} {p['seconds']:.2f} s hits {_ratio(p['hit_ratio'])}"
                       for i, p in enumerate(passes))
    warnings = "".join(f"WARNING {w}; " for w in record.facts.get("warnings", []))
    return (f"hstu-replay flow l0: PASS {record.options.config}: {checked} responses (1 warm-up + "
            f"{len(passes)} x {passes[0]['requests']}) within {record.options.tolerance:g} of the C++ reference "
            f"(max |diff| {worst:.3g}); {phases}; {warnings}{tail}")


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
