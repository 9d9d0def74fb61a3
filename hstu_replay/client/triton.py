"""A thin Triton client for the HSTU models: protocol choice, interface detection, one infer call.

gRPC (default) or HTTP, TLS and extra headers (auth tokens) on either. The model's metadata is
read once and matched against the interface registry; a model that matches none is refused
with one line saying what was expected and what was found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from hstu_replay.errors import ConfigError, InterfaceMismatch, ServerError, ServerUnavailable
from hstu_replay.interface import INTERFACES, NUM_TASKS, ModelInterface, TensorSpec
from hstu_replay.request import RequestTensors

#: Optional output of our reference target: tokens each user reused from the KV cache.
CACHED_TOKENS_OUTPUT = "CACHED_TOKENS"


@dataclass(frozen=True)
class ClientOptions:
    url: str = "127.0.0.1:8001"
    protocol: str = "grpc"  # grpc | http
    model: str = "hstu_gr_ranking_kvcache"
    ssl: bool = False
    root_certificates: str | None = None  # PEM file, gRPC
    insecure: bool = False  # HTTP: skip certificate checks
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0

    def __post_init__(self):
        if self.protocol not in ("grpc", "http"):
            raise ConfigError(f"--triton-protocol {self.protocol!r}: use grpc or http")
        if "://" in self.url:
            raise ConfigError(f"--triton-url {self.url!r}: give host:port without a scheme (use --triton-ssl for TLS)")


@dataclass(frozen=True)
class ModelBinding:
    """What connecting found: the model's interface, and whether it reports its cache hits."""

    interface: ModelInterface
    reports_hits: bool


@dataclass(frozen=True)
class InferResponse:
    logits: np.ndarray  # float32 [sum(num_candidates), 8]
    cached_tokens: np.ndarray | None  # int64 [B], when the server reports its hits


def _specs_from_metadata(entries) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(e["name"], e["datatype"], tuple(int(d) for d in e["shape"])) for e in entries)


def match_interface(model: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> ModelInterface:
    """The registered interface whose inputs equal the model's and whose outputs it provides."""
    found_in = {t.name: t for t in inputs}
    found_out = {t.name: t for t in outputs}
    for interface in INTERFACES.values():
        if {t.name: t for t in interface.inputs} == found_in and all(
            found_out.get(t.name) == t for t in interface.outputs
        ):
            return interface
    expected = "; ".join(f"{i.name}: {i.signature()}" for i in INTERFACES.values())
    found = ModelInterface("found", model, inputs, outputs, {}, "").signature()
    raise InterfaceMismatch(f"model {model!r} matches no HSTU interface: expected one of [{expected}], found {found}")


class TritonClient:
    """One connection to one model; not shared between Locust users."""

    def __init__(self, options: ClientOptions):
        self.options = options
        self._headers = dict(options.headers) or None
        try:
            if options.protocol == "grpc":
                import tritonclient.grpc as module

                _no_second_close_at_exit(module.InferenceServerClient)
                self._client = module.InferenceServerClient(
                    options.url, ssl=options.ssl, root_certificates=options.root_certificates
                )
            else:
                import tritonclient.http as module

                self._client = module.InferenceServerClient(
                    options.url, ssl=options.ssl, insecure=options.insecure,
                    connection_timeout=options.timeout_s, network_timeout=options.timeout_s,
                )
        except Exception as exc:  # tritonclient raises assorted types for bad urls
            raise ConfigError(f"--triton-url {options.url!r}: {exc}") from None
        self._module = module
        self.binding: ModelBinding | None = None

    def connect(self) -> ModelBinding:
        """Read the model's metadata and pick its interface (one line on failure)."""
        try:
            meta = self._client.get_model_metadata(self.options.model, headers=self._headers, **self._as_json())
        except Exception as exc:
            raise ServerError(f"cannot read model {self.options.model!r} at {self.options.url} "
                              f"({self.options.protocol}): {_one_line(exc)}") from None
        inputs, outputs = _specs_from_metadata(meta["inputs"]), _specs_from_metadata(meta["outputs"])
        self.binding = ModelBinding(match_interface(self.options.model, inputs, outputs),
                                    any(t.name == CACHED_TOKENS_OUTPUT for t in outputs))
        return self.binding

    def infer(self, tensors: RequestTensors) -> InferResponse:
        """Send one request; raises ServerError with the server's message on failure."""
        binding = self.binding or self.connect()
        interface = binding.interface
        inputs = []
        for name, array in tensors.inputs(interface).items():
            item = self._module.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(array)
            inputs.append(item)
        names = [interface.logits_output] + ([CACHED_TOKENS_OUTPUT] if binding.reports_hits else [])
        outputs = [self._module.InferRequestedOutput(n) for n in names]
        try:
            if self.options.protocol == "grpc":
                result = self._client.infer(self.options.model, inputs, outputs=outputs, headers=self._headers,
                                            client_timeout=self.options.timeout_s)
            else:
                result = self._client.infer(self.options.model, inputs, outputs=outputs, headers=self._headers)
        except Exception as exc:
            raise (ServerUnavailable if _unavailable(exc) else ServerError)(_one_line(exc)) from None
        logits = _output(result, interface.logits_output, (tensors.num_logits, NUM_TASKS))
        cached = _output(result, CACHED_TOKENS_OUTPUT, (tensors.batch_size,)) if binding.reports_hits else None
        return InferResponse(logits, cached)

    def server_statistics(self, model: str | None = None) -> dict:
        """Triton's per-model statistics (queue/compute split) as a dict; {} if not permitted."""
        try:
            return self._client.get_inference_statistics(model or self.options.model, headers=self._headers,
                                                         **self._as_json())
        except Exception:
            return {}

    def close(self) -> None:
        """Close explicitly: a gRPC channel left to __del__ can hang interpreter exit."""
        try:
            self._client.close()
        except Exception:
            pass

    def _as_json(self) -> dict:
        return {"as_json": True} if self.options.protocol == "grpc" else {}


def _unavailable(exc: Exception) -> bool:
    """Whether the server was not there to take the request (gRPC UNAVAILABLE; a refused or
    reset HTTP connection; a server up again whose model is not loaded yet: the model was found
    before the run started), as opposed to a request it took and failed or timed out."""
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError)):
        return True
    status = getattr(exc, "status", None)
    if callable(status) and str(status()) in ("StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND"):
        return True
    return "unknown model" in str(exc)


def _output(result, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """One output of a response, checked against the shape the request implies (a malformed
    answer is a failed request, never a silently unverified one)."""
    array = result.as_numpy(name)
    if array is None:
        raise ServerError(f"response lacks output {name}")
    if array.shape != shape:
        raise ServerError(f"response output {name} has shape {list(array.shape)}; the request implies {list(shape)}")
    return array


def _no_second_close_at_exit(cls) -> None:
    """tritonclient's gRPC client closes its channel again in __del__; when that runs at
    interpreter teardown under gevent it can block forever (seen: a Locust process that wrote
    its report, then never exited). Every TritonClient is closed explicitly instead."""
    if getattr(cls, "_hstu_close_in_del", True):
        cls.__del__ = lambda self: None
        cls._hstu_close_in_del = False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
