"""Serve the reference target from C++: tritonserver loads our own backend, no Python in its process.

`server serve --frontend cpp-backend`: `cpp/backend` is built with CMake (once) into
`libtriton_hstu.so` against the torch wheel's libtorch and the libtritonserver bundled with
nvidia-pytriton, and laid out as Triton's backend `hstu` (`<backends>/hstu/libtriton_hstu.so`).
Each of the four models is a folder whose config.pbtxt names `backend: "hstu"`, its role and
its sizes as parameters, and whose version folder holds the batched-step AOTInductor package as
`model.pt2` (the `batched-aoti` engine's, compiled by this process before the server starts).
On a CPU the package's attention operator is the backend's own C++ one.

The cache-metrics port is served here, from the control model's answer at each scrape. The host
tier (`--host-budget-tokens`) is the backend's own C++ one (`cpp/backend/host_tier.cpp`), with the
semantics of `host_tier.HostTier`.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hstu_replay.cmake_build import ROOT, build_cmake
from hstu_replay.errors import ConfigError
from hstu_replay.interface import CONTROL_MODEL, KVCACHE, INTERFACES
from hstu_replay.process import Child, model_ready
from hstu_replay.server.host_tier import NO_HOST_STATS
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.python_backend import ModelEntry, model_entries, serve_workspace, tritonserver
from hstu_replay.server.repository import PACKAGE_NAME
from hstu_replay.server.serve import CONTROL_OUTPUTS, ServeOptions
from hstu_replay.server.serve_config import HostTierOptions

BACKEND_NAME = "hstu"  # Triton finds it as <backends>/hstu/libtriton_hstu.so
LIBRARY_NAME = f"libtriton_{BACKEND_NAME}.so"
SOURCE_DIR = ROOT / "cpp" / "backend"
DEFAULT_BUILD_DIR = ROOT / "build" / "backend"
VERSION = "1"  # the one version folder of every model
CONTROL_TIMEOUT_S = 30.0


def tritonserver_library() -> Path:
    """The libtritonserver the bundled tritonserver runs (nvidia-pytriton keeps it among its libraries)."""
    from pytriton.utils.distribution import get_libs_path

    found = sorted(Path(get_libs_path()).glob("libtritonserver*.so*"))
    if not found:
        raise ConfigError(f"{get_libs_path()}: nvidia-pytriton ships no libtritonserver here")
    return found[0]


def build_backend(build_dir: str | Path | None = None) -> Path:
    """`libtriton_hstu.so`, built with CMake unless it is newer than its sources (one-line error
    naming what is missing where it cannot be built)."""
    build_dir = Path(build_dir) if build_dir is not None else DEFAULT_BUILD_DIR
    return build_cmake(SOURCE_DIR, build_dir, LIBRARY_NAME, "the C++ Triton backend", "C++ backend",
                       (f"TRITONSERVER_LIBRARY={tritonserver_library()}",))


@dataclass(frozen=True)
class CppBackendSettings:
    """What the backend's models need: the model's sizes, the cache and the package they serve."""

    config: ModelConfig
    package: Path  # the batched-step AOTInductor package
    cache_budget_tokens: int
    page_tokens: int
    host: HostTierOptions = HostTierOptions()  # the cached model's host tier (budget 0: none)
    reserve_pool: bool = False  # the cached model's pool taken whole at start


ROLE_OF_MODEL = {KVCACHE.model_name: "cached", CONTROL_MODEL: "control"}  # the other models: uncached


def parameters(entry: ModelEntry, settings: CppBackendSettings, publish_limits: bool = True) -> dict[str, str]:
    """The config.pbtxt parameters the backend reads (cpp/backend/backend.cpp): strings, no quotes; a
    ranking model's also publish its limits for clients (`publish_limits`)."""
    role = ROLE_OF_MODEL.get(entry.name, "uncached")
    if role == "control":
        return {"role": role, "cache_model": KVCACHE.model_name, "outputs": ",".join(CONTROL_OUTPUTS)}
    interface = next(i for i in INTERFACES.values() if i.model_name == entry.name)
    cfg = settings.config
    sizes = {"num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "head_dim": cfg.head_dim,
             "max_batch": cfg.max_batch, "max_history": cfg.max_history, "max_candidates": cfg.max_candidates,
             "page_tokens": settings.page_tokens, "cache_budget_tokens": settings.cache_budget_tokens}
    if role == "cached":
        host = settings.host
        sizes |= {"host_budget_tokens": host.budget_tokens, "offload_mode": host.mode.value,
                  "offload_chunk_tokens": host.chunk_tokens, "reserve_pool": int(settings.reserve_pool)}
    return {"role": role, "dtype": cfg.dtype, "logits_output": interface.logits_output,
            "inputs": ",".join(f"{field}={name}" for field, name in interface.field_to_input.items()),
            **{key: str(value) for key, value in sizes.items()},
            **(cfg.limits.parameters() if publish_limits else {})}


def config_text(entry: ModelEntry, values: dict[str, str]) -> str:
    """A config.pbtxt naming our backend: the published tensors, no Triton batching, one instance."""
    def tensors(section: str, specs) -> str:
        items = [f'  {{ name: "{t.name}" data_type: TYPE_{t.dtype} dims: [ {", ".join(str(d) for d in t.dims)} ] }}'
                 for t in specs]
        return f"{section} [\n" + ",\n".join(items) + "\n]"

    lines = [f'name: "{entry.name}"', f'backend: "{BACKEND_NAME}"', "max_batch_size: 0",
             tensors("input", entry.inputs), tensors("output", entry.outputs),
             "instance_group [ { count: 1 kind: KIND_CPU } ]"]
    lines += [f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}' for key, value in values.items()]
    return "\n".join(lines) + "\n"


def write_repository(root: Path, settings: CppBackendSettings, publish_limits: bool = True) -> None:
    """The four models; each ranking model's version folder links the package as model.pt2."""
    for entry in model_entries():
        folder = root / entry.name
        (folder / VERSION).mkdir(parents=True)
        values = parameters(entry, settings, publish_limits)
        (folder / "config.pbtxt").write_text(config_text(entry, values))
        if values["role"] != "control":
            (folder / VERSION / PACKAGE_NAME).symlink_to(settings.package.resolve())


def install_backend(library: Path, backends: Path) -> None:
    """`library` laid out as Triton's backend `hstu` under `backends`."""
    (backends / BACKEND_NAME).mkdir(parents=True)
    shutil.copy2(library, backends / BACKEND_NAME / LIBRARY_NAME)


class ControlModelStats:
    """The cache's figures, read through the control model of the server at `url` (host:port, HTTP):
    for the cache-metrics port, and for whoever reads a server's cache from outside."""

    def __init__(self, url: str) -> None:
        self.url = url

    def stats(self) -> dict[str, int]:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=CONTROL_TIMEOUT_S)
        try:
            clear = httpclient.InferInput("CLEAR", [1], "INT64")
            clear.set_data_from_numpy(np.zeros(1, dtype=np.int64))
            result = client.infer(CONTROL_MODEL, [clear])
        finally:
            client.close()
        return {**NO_HOST_STATS, **{name.lower(): int(result.as_numpy(name)[0]) for name in CONTROL_OUTPUTS}}

    @property
    def cache(self) -> ControlModelStats:  # what `serve.CacheCollector` reads: `engine.cache.stats()`
        return self


def serve_cpp(settings: CppBackendSettings, options: ServeOptions, library: Path,
              stop: threading.Event | None = None) -> None:
    """Run tritonserver with our backend's repository until SIGINT/SIGTERM (or `stop`); clean shutdown."""
    from hstu_replay.server.serve import start_cache_metrics
    from pytriton.utils.distribution import get_libs_path, get_root_module_path

    def setup(workspace: Path, stopped) -> Child:
        install_backend(library, workspace / "backends")
        write_repository(workspace / "models", settings, options.publish_limits)
        ready = model_ready(options.http_port, [entry.name for entry in model_entries()], options.http_host)
        binary = get_root_module_path() / "tritonserver" / "bin" / "tritonserver"
        return tritonserver(binary, workspace / "backends", workspace / "models", options, Path(get_libs_path()),
                            ready=lambda: stopped() or ready())

    serve_workspace(options, stop, f"C++ backend models ({LIBRARY_NAME})", setup,
                    beside=lambda: start_cache_metrics(ControlModelStats(f"{options.http_host}:{options.http_port}"),
                                                       options))
