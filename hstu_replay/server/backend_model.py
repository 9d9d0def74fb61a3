"""The reference target's models inside Triton's Python backend (`server serve --frontend python-backend`).

Imported by the backend stub only (`triton_python_backend_utils` exists there alone): each model
reads its `python_backend.BackendSettings` from its config and plays one role:
- `cached`: builds the engine with the KV cache, serves the cache-metrics port and answers the
  control model over a Unix socket (one line in: `clear` or `stats`; one JSON line out);
- `uncached`: builds the engine with an empty cache budget (the no-cache interfaces);
- `control`: asks the cached model's socket and answers with the cache's counters.
Requests are answered by the same code as PyTriton's handlers (`serve.infer_outputs`,
`serve.control_outputs`); a request that fails gets an error response naming why.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading

import triton_python_backend_utils as pb_utils

from hstu_replay.interface import INTERFACES
from hstu_replay.server.batched import BatchedEngine
from hstu_replay.server.python_backend import PARAMETER, BackendSettings
from hstu_replay.server.phases import NO_CLOCK, PhaseClock, phases_every
from hstu_replay.server.serve import ServeOptions, control_outputs, infer_outputs, start_cache_metrics, wants_clear

CONTROL_TIMEOUT_S = 30.0


def build_engines(settings: BackendSettings, budget: int):
    from hstu_replay.server.build import ENGINE_KINDS
    from hstu_replay.server.cli import resolve_device
    from hstu_replay.server.model_config import get_config

    config = get_config(settings.config, settings.dtype)
    return ENGINE_KINDS[settings.engine](settings.repository, config, settings.seed, budget, settings.page_tokens,
                                         resolve_device(settings.device), settings.host_tier, settings.reserve_pool)


class Ranking:
    """A no-cache model: its engine keeps nothing between requests."""

    with_cache_outputs = False

    def __init__(self, settings: BackendSettings) -> None:
        self.interface = next(i for i in INTERFACES.values() if i.model_name == settings.model)
        self.engine = self.build(settings)
        self.clock = PhaseClock(settings.model, phases_every())
        if isinstance(self.engine, BatchedEngine):
            self.engine.clock = self.clock

    def build(self, settings: BackendSettings):
        return build_engines(settings, 0).uncached

    def answer(self, request) -> dict:
        inputs = {}
        with self.clock.phase("inputs"):
            for spec in self.interface.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
                if tensor is not None:
                    inputs[spec.name] = tensor.as_numpy()
        return infer_outputs(self.engine, inputs, self.interface, self.with_cache_outputs, self.clock)

    def close(self) -> None:
        pass


class CachedRanking(Ranking):
    """The KV-cache model: owns the cache, its metrics port and the control socket."""

    with_cache_outputs = True

    def __init__(self, settings: BackendSettings) -> None:
        super().__init__(settings)
        options = ServeOptions(host=settings.host, grpc_port=settings.grpc_port, http_port=settings.http_port,
                               cache_metrics_port=settings.cache_metrics_port)
        self.metrics = start_cache_metrics(self.engine, options)
        engine = self.engine

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                if self.rfile.readline(64).strip() == b"clear":
                    engine.clear_cache()
                self.wfile.write(json.dumps(engine.cache.stats()).encode() + b"\n")

        self.control = socketserver.ThreadingUnixStreamServer(settings.control_socket, Handler)
        threading.Thread(target=self.control.serve_forever, name="cache-control", daemon=True).start()

    def build(self, settings: BackendSettings):
        return build_engines(settings, settings.cache_budget_tokens).cached

    def close(self) -> None:
        self.control.shutdown()
        self.control.server_close()
        self.metrics.shutdown()


class Control:
    """The control model: the cached model's counters, after emptying its cache when CLEAR is 1."""

    clock = NO_CLOCK

    def __init__(self, settings: BackendSettings) -> None:
        self.socket_path = settings.control_socket

    def answer(self, request) -> dict:
        clear = wants_clear(pb_utils.get_input_tensor_by_name(request, "CLEAR").as_numpy())
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(CONTROL_TIMEOUT_S)
            sock.connect(self.socket_path)
            sock.sendall(b"clear\n" if clear else b"stats\n")
            with sock.makefile("rb") as answer:
                return control_outputs(json.loads(answer.readline()))

    def close(self) -> None:
        pass


ROLES = {"uncached": Ranking, "cached": CachedRanking, "control": Control}


class TritonPythonModel:
    """Triton's Python-backend entry points."""

    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        settings = BackendSettings.from_json(config["parameters"][PARAMETER]["string_value"])
        self.role = ROLES[settings.role](settings)

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            with self.role.clock.call():
                try:
                    outputs = self.role.answer(request)
                except Exception as exc:  # every failure is the client's answer, never the stub's end
                    error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}")
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                with self.role.clock.phase("outputs"):
                    responses.append(pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs.items()]))
        return responses

    def finalize(self) -> None:
        self.role.close()

