"""Serve the reference target on the bundled tritonserver directly, as a Python-backend model repository.

`server serve --frontend python-backend`: no PyTriton proxy process. Each of the four models is a
Triton Python-backend model (`backend_model.TritonPythonModel`) whose backend stub builds its own
engine and answers Triton's requests itself: inputs and outputs cross one shared-memory hop
(tritonserver <-> stub) where PyTriton adds a second (stub <-> the proxy's own process). The
repository, a copy of the Python backend with the stub for this interpreter and a Unix socket
live in a private workspace removed at the end.

Who holds what: the KV-cache model's stub owns the cache, serves the cache-metrics port and
answers the control model's stub over the workspace's Unix socket (`clear` / `stats`, one JSON
line back); the no-cache models build their own engine with an empty cache budget. Models load one
after another (an AOTI repository is compiled once, by the first).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import hstu_replay
from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, OffloadMode
from hstu_replay.errors import ServerError
from hstu_replay.interface import CONTROL_MODEL, KVCACHE, NOCACHE, PYTHON_BACKEND, TensorSpec
from hstu_replay.process import Child, StartFailed, Stopping, model_ready
from hstu_replay.server.serve_config import HostTierOptions
from hstu_replay.server.model_config import get_config
from hstu_replay.server.phases import phases_every
from hstu_replay.server.serve import (
    CONTROL_OUTPUTS, ServeOptions, check_ports_free, python_backend_env, run_until_stopped,
)
from hstu_replay.server.tls_proxy import TlsForwarder

PARAMETER = "hstu"  # the config.pbtxt parameter carrying BackendSettings as JSON
SOCKET_NAME = "cache.sock"
START_LIMIT_S = 3600.0  # compiling an AOTI repository on first start can take minutes
#: tritonserver's Python-backend shared memory: start at 64 MiB (a full batch-8 request is ~0.6 MB)
SHM_DEFAULT_BYTES = 64 * 2**20
#: SIGINT: tritonserver unloads its models and exits (killed when it has not after the usual grace)
TRITONSERVER_STOPPING = Stopping(signal.SIGINT)


@dataclass(frozen=True)
class BackendSettings:
    """What a model's stub needs to build its part (written into config.pbtxt as JSON)."""

    role: str  # "cached", "uncached" or "control" (backend_model.ROLES)
    model: str  # the served model's name
    engine: str  # build.ENGINE_KINDS key
    repository: str
    config: str
    dtype: str | None
    seed: int
    cache_budget_tokens: int
    page_tokens: int
    device: str
    host: str  # where the cache-metrics port listens
    cache_metrics_port: int
    control_socket: str
    host_budget_tokens: int = 0  # the host tier behind the cache
    offload_mode: str = OffloadMode.NATIVE.value
    offload_chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS
    reserve_pool: bool = False  # the cached model's pool taken whole at start
    grpc_port: int = 0  # the server's own ports, which its cache-metrics page names (serve.ServerInfoCollector)
    http_port: int = 0
    publish_limits: bool = True  # the ranking models' configurations publish the model's limits

    @property
    def host_tier(self) -> HostTierOptions:
        return HostTierOptions(self.host_budget_tokens, OffloadMode(self.offload_mode), self.offload_chunk_tokens)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BackendSettings:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class ModelEntry:
    role: str
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def model_entries() -> list[ModelEntry]:
    """The four served models, each with the published tensors (and the KV-cache model's extensions:
    CACHED_TOKENS, HOST_CACHED_TOKENS)."""
    entries = [ModelEntry("cached", KVCACHE.model_name, KVCACHE.inputs, KVCACHE.outputs + KVCACHE.extensions)]
    entries += [ModelEntry("uncached", i.model_name, i.inputs, i.outputs) for i in (NOCACHE, PYTHON_BACKEND)]
    control_out = tuple(TensorSpec(n, "INT64", (1,)) for n in CONTROL_OUTPUTS)
    entries.append(ModelEntry("control", CONTROL_MODEL, (TensorSpec("CLEAR", "INT64", (1,)),), control_out))
    return entries


def _tensors(section: str, specs: tuple[TensorSpec, ...]) -> str:
    items = [f'  {{ name: "{t.name}" data_type: TYPE_{t.dtype} dims: [ {", ".join(str(d) for d in t.dims)} ] }}'
             for t in specs]
    return f"{section} [\n" + ",\n".join(items) + "\n]"


def config_text(entry: ModelEntry, settings: BackendSettings | None, instances: int = 1) -> str:
    """A Python-backend config.pbtxt: `instances` CPU-kind instances (the engine picks its own
    device), `settings` as its parameter (none for a model that needs none)."""
    lines = [f'name: "{entry.name}"', 'backend: "python"', "max_batch_size: 0",
             _tensors("input", entry.inputs), _tensors("output", entry.outputs),
             f"instance_group [ {{ count: {instances} kind: KIND_CPU }} ]"]
    if settings is not None:
        value = json.dumps(settings.to_json())
        lines.append(f"parameters {{ key: \"{PARAMETER}\" value: {{ string_value: {value} }} }}")
    if settings is not None and settings.publish_limits and entry.role != "control":
        limits = get_config(settings.config, settings.dtype).limits
        lines += [f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
                  for key, value in limits.parameters().items()]
    return "\n".join(lines) + "\n"


def model_file(paths: list[str], module: str = "hstu_replay.server.backend_model") -> str:
    """The version folder's model.py: the stub's Python gets this interpreter's import paths first,
    then takes `module`'s TritonPythonModel."""
    return ("import sys\n"
            f"sys.path[:0] = [p for p in {paths!r} if p not in sys.path]\n"
            f"from {module} import TritonPythonModel  # noqa: E402,F401\n")


def import_paths() -> list[str]:
    """This process's import paths, the package's own folder first (an editable install's too)."""
    own = str(Path(hstu_replay.__file__).resolve().parents[1])
    return [own] + [p for p in sys.path if p and p != own and os.path.isdir(p)]


def write_repository(root: Path, base: BackendSettings) -> None:
    for entry in model_entries():
        settings = BackendSettings(**{**asdict(base), "role": entry.role, "model": entry.name})
        folder = root / entry.name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config_text(entry, settings))
        (folder / "1" / "model.py").write_text(model_file(import_paths()))


def prepare_backend(root: Path) -> tuple[Path, Path, Path]:
    """(tritonserver, backends folder, its libraries): the Python backend copied beside the stub for
    this interpreter, as PyTriton lays it out."""
    from pytriton.utils.distribution import get_libs_path, get_root_module_path, get_stub_path

    dist = get_root_module_path() / "tritonserver"
    stub = get_stub_path(f"{sys.version_info.major}.{sys.version_info.minor}")
    if not stub.is_file():
        raise ServerError(f"PyTriton ships no Python-backend stub for Python {sys.version_info.major}."
                          f"{sys.version_info.minor} ({stub})")
    python = root / "backends" / "python"
    shutil.copytree(dist / "backends" / "python", python, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(stub, python / "triton_python_backend_stub")
    return dist / "bin" / "tritonserver", root / "backends", get_libs_path()


def server_arguments(binary: Path, backends: Path, repository: Path, options: ServeOptions) -> list[str]:
    args = [str(binary), f"--model-repository={repository}", f"--backend-directory={backends}",
            f"--http-address={options.http_host}", f"--http-port={options.http_port}",
            f"--grpc-address={options.host}", f"--grpc-port={options.grpc_port}",
            f"--metrics-address={options.host}", f"--metrics-port={options.metrics_port}",
            f"--log-verbose={options.log_verbose}", "--exit-on-error=true", "--model-load-thread-count=1",
            "--strict-readiness=true",
            f"--backend-config=python,shm-region-prefix-name=hstu{os.getpid()}-{secrets.token_hex(4)}",
            f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}"]
    for rule in options.restrictions(secrets.token_urlsafe(32)):
        args += [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]
    if options.tls is not None:
        args += ["--grpc-use-ssl=true", f"--grpc-server-cert={options.tls.cert}",
                 f"--grpc-server-key={options.tls.key}"]
    return args


def server_env(libs: Path) -> dict[str, str]:
    python_backend_env()  # the stub links the system libpython: this interpreter's first
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = f"{env['LD_LIBRARY_PATH']}:{libs}" if env.get("LD_LIBRARY_PATH") else str(libs)
    # the stub's embedded Python finds its prefix (a virtual environment's too) from the PATH's python
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def tritonserver(binary: Path, backends: Path, repository: Path, options: ServeOptions, libs: Path,
                 ready: Callable[[], bool] | None = None) -> Child:
    """The bundled tritonserver on a Python-backend `repository`, not started yet: its log goes into
    this process's output."""
    return Child(server_arguments(binary, backends, repository, options), None, name="tritonserver",
                 env=server_env(libs), stopping=TRITONSERVER_STOPPING, ready=ready, what="the models",
                 ready_timeout_s=START_LIMIT_S, listens=(options.http_port, options.grpc_port, options.metrics_port))


def stop_tritonserver(server: Child) -> None:
    """Stopped, and a line for whatever it left behind (the leftovers are killed by then)."""
    teardown = server.stop()
    if not teardown.clean:
        print(f"hstu-replay: tritonserver left {', '.join(teardown.left)} behind", file=sys.stderr, flush=True)


def serve_workspace(options: ServeOptions, stop: threading.Event | None, what: str,
                    setup: Callable[[Path, Callable[[], bool]], Child],
                    beside: Callable[[], object] = lambda: None) -> None:
    """Serve from a tritonserver of our own until SIGINT/SIGTERM (or `stop`), then shut down
    cleanly: `setup(workspace, stopped)` writes the repository into a fresh workspace and returns
    the tritonserver `Child` (`stopped` ends its readiness wait early); `beside` may start
    something served beside it, before it starts, so that it answers once the models are ready (its
    result's `shutdown()` is called at the end); `what` names the models in the ready line."""
    check_ports_free(options)
    phases_every()  # a bad HSTU_REPLAY_BACKEND_PHASES is refused here, before any model loads
    stop = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workspace = Path(tempfile.mkdtemp(prefix="hstu-serve-"))
    started = time.monotonic()
    https = extra = server = None
    try:
        server = setup(workspace, stop.is_set)
        extra = beside()
        server.start()
        if options.https_port:
            https = TlsForwarder(options.host, options.https_port, (options.http_host, options.http_port),
                                 options.tls)
        server.wait_ready()
        if stop.is_set():
            return
        print(f"hstu-replay: {options.describe()}; {what} (ready in {time.monotonic() - started:.1f} s)", flush=True)
        run_until_stopped(lambda: server.running, stop)
    except StartFailed as exc:
        raise ServerError(str(exc)) from None
    except OSError as exc:
        raise ServerError(f"tritonserver failed to start: {exc}") from None
    finally:
        if extra is not None:
            extra.shutdown()
        if https is not None:
            https.close()
        if server is not None:
            stop_tritonserver(server)
        shutil.rmtree(workspace, ignore_errors=True)
        print("hstu-replay: server stopped", file=sys.stderr, flush=True)


def serve_native(base: BackendSettings, options: ServeOptions, stop: threading.Event | None = None) -> None:
    """Run tritonserver on a Python-backend repository until SIGINT/SIGTERM (or `stop`); clean shutdown."""

    def setup(workspace: Path, stopped: Callable[[], bool]) -> Child:
        binary, backends, libs = prepare_backend(workspace)
        settings = BackendSettings(**{**asdict(base), "host": options.host, "publish_limits": options.publish_limits,
                                      "cache_metrics_port": options.cache_metrics_port,
                                      "grpc_port": options.grpc_port, "http_port": options.http_port,
                                      "control_socket": str(workspace / SOCKET_NAME)})
        write_repository(workspace / "models", settings)
        ready = model_ready(options.http_port, [entry.name for entry in model_entries()], options.http_host)
        return tritonserver(binary, backends, workspace / "models", options, libs, ready=lambda: stopped() or ready())

    serve_workspace(options, stop, "Python-backend models, no proxy", setup)
