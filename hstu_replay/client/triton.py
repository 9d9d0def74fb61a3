"""A thin Triton client for the HSTU models: protocol choice, interface detection, one infer call.

gRPC (default) or HTTP, TLS and extra headers (auth tokens) on either. The model's metadata is
read once and matched against the interface registry; a model that matches none is refused
with one line saying what was expected and what was found. Metadata and statistics go through
tritonclient; inference goes through a transport of the protocol's (`transport`: over gRPC,
HTTP/2 by `h2` on a plain socket or grpcio, `GRPC_TRANSPORTS`), which sends the request's
buffers without copying them in Python.
"""

from __future__ import annotations

import importlib
import re
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from hstu_replay.errors import AccessDenied, ConfigError, InterfaceMismatch, ServerError
from hstu_replay.client.limits import published_limits
from hstu_replay.interface import DEFAULT_ADDRESS, INTERFACES, NUM_TASKS, Limits, ModelInterface, TensorSpec
from hstu_replay.request import RequestTensors

#: Optional output of our reference target: tokens each user reused from the KV cache.
CACHED_TOKENS_OUTPUT = "CACHED_TOKENS"
#: Optional output of a two-tier server: the part of CACHED_TOKENS onboarded from the host tier.
HOST_CACHED_TOKENS_OUTPUT = "HOST_CACHED_TOKENS"
#: Outputs of a two-tier server's control model: its pools' budgets in tokens (host 0: no host tier).
BUDGET_OUTPUTS = ("GPU_BUDGET_TOKENS", "HOST_BUDGET_TOKENS")


#: RFC 9110's token: what a header name may be made of
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class ServerBudgets:
    """What a two-tier server's control model says of its pools."""

    gpu_tokens: int
    host_tokens: int


@dataclass(frozen=True)
class ClientOptions:
    url: str = DEFAULT_ADDRESS
    protocol: str = "grpc"  # grpc | http
    model: str = "hstu_gr_ranking_kvcache"
    ssl: bool = False
    root_certificates: str | None = None  # PEM file of the CA(s) that signed the server's certificate
    insecure: bool = False  # HTTP: skip certificate checks
    headers: Mapping[str, str] = field(default_factory=dict)  # names are sent in lower case
    timeout_s: float = 60.0
    grpc_transport: str = "h2"  # gRPC's inference requests: h2 (HTTP/2 on a plain socket) or grpcio
    route_header: str = ""  # a header carrying each request's route key, for a gateway to hash on

    def __post_init__(self):
        if self.protocol not in ("grpc", "http"):
            raise ConfigError(f"--triton-protocol {self.protocol!r}: use grpc or http")
        if self.grpc_transport not in GRPC_TRANSPORTS:
            raise ConfigError(f"--triton-grpc-transport {self.grpc_transport!r}: use {' or '.join(GRPC_TRANSPORTS)}")
        if "://" in self.url:
            raise ConfigError(f"--triton-url {self.url!r}: give host:port without a scheme (use --triton-ssl for TLS)")
        if self.root_certificates and not self.ssl:
            raise ConfigError("--triton-root-cert needs TLS: a grpcs:// or https:// address, or --triton-ssl")
        if self.route_header and not HEADER_NAME.fullmatch(self.route_header):
            raise ConfigError(f"--routing-header {self.route_header!r}: a header name is letters, digits and "
                              "!#$%&'*+-.^_`|~ only")
        object.__setattr__(self, "route_header", self.route_header.lower())
        # gRPC refuses metadata keys with capitals; HTTP header names are case-insensitive
        object.__setattr__(self, "headers", {k.strip().lower(): v for k, v in self.headers.items()})

    def __repr__(self) -> str:  # header values are secrets (auth tokens)
        return (f"ClientOptions(url={self.url!r}, protocol={self.protocol!r}, model={self.model!r}, ssl={self.ssl}, "
                f"grpc_transport={self.grpc_transport!r}, root_certificates={self.root_certificates!r}, "
                f"headers={sorted(self.headers)} (values hidden))")


@dataclass(frozen=True)
class ModelBinding:
    """What connecting found: the model's interface, and whether it reports its cache hits."""

    interface: ModelInterface
    reports_hits: bool
    reports_tiers: bool = False  # HOST_CACHED_TOKENS beside CACHED_TOKENS
    limits: Limits | None = None  # what the model's configuration publishes (client.limits); None: nothing

    @property
    def outputs(self) -> tuple[str, ...]:
        """The outputs each request asks for."""
        return ((self.interface.logits_output,) + ((CACHED_TOKENS_OUTPUT,) if self.reports_hits else ())
                + ((HOST_CACHED_TOKENS_OUTPUT,) if self.reports_tiers else ()))


@dataclass(frozen=True)
class InferResponse:
    logits: np.ndarray  # float32 [sum(num_candidates), 8]
    cached_tokens: np.ndarray | None  # int64 [B], when the server reports its hits
    latency_s: float  # on the wire: from the request's first byte out to the answer's last byte in
    host_cached_tokens: np.ndarray | None = None  # int64 [B]: the part onboarded from the host tier


class Transport(Protocol):
    """Sends one inference request: int64 inputs as (name, contiguous pieces); returns outputs by
    name and the request's time on the wire (encoding and decoding left out, as perf_analyzer's)."""

    def infer(self, inputs: Sequence[tuple[str, tuple[np.ndarray, ...]]],
              outputs: Sequence[str]) -> tuple[dict[str, np.ndarray], float]: ...

    def close(self) -> None: ...


def _grpcio_transport(options: ClientOptions) -> Transport:
    import grpc

    from hstu_replay.client.grpc_infer import GrpcInfer

    credentials = None
    if options.ssl:
        roots = None
        if options.root_certificates:
            try:
                with open(options.root_certificates, "rb") as f:
                    roots = f.read()
            except OSError as exc:
                raise ConfigError(f"--triton-root-cert {options.root_certificates!r}: {exc.strerror}") from None
        credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    return GrpcInfer(options.url, options.model, dict(options.headers), options.timeout_s, credentials)


def _h2_transport(options: ClientOptions) -> Transport:
    from hstu_replay.client.h2_grpc import H2Grpc

    host, port = _host_port(options)
    context = _tls_context(options)
    if context is not None:
        context.set_alpn_protocols(["h2"])  # gRPC servers take HTTP/2 over TLS only when it is agreed
    return H2Grpc(host, port, options.model, dict(options.headers), options.timeout_s, context)


def _http_transport(options: ClientOptions) -> Transport:
    from hstu_replay.client.http_infer import HttpInfer

    host, port = _host_port(options)
    context = _tls_context(options)
    if context is not None and options.insecure:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return HttpInfer(host, port, options.model, dict(options.headers), options.timeout_s, context)


def _host_port(options: ClientOptions) -> tuple[str, int]:
    host, _, port = options.url.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--triton-url {options.url!r}: give host:port")
    return host.strip("[]"), int(port)


def _tls_context(options: ClientOptions) -> ssl.SSLContext | None:
    """With TLS: a context that checks the server's certificate against --triton-root-cert (else the system's CAs)."""
    if not options.ssl:
        return None
    try:
        return ssl.create_default_context(cafile=options.root_certificates or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--triton-root-cert {options.root_certificates!r}: {exc}") from None


#: --triton-grpc-transport -> the transport gRPC inference requests go through
GRPC_TRANSPORTS: dict[str, Callable[[ClientOptions], Transport]] = {"h2": _h2_transport, "grpcio": _grpcio_transport}


def transport(options: ClientOptions) -> Transport:
    """The transport of the options' protocol (and, for gRPC, of --triton-grpc-transport)."""
    return _http_transport(options) if options.protocol == "http" else GRPC_TRANSPORTS[options.grpc_transport](options)


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
        self._made = None  # tritonclient's client, for metadata and statistics: made when first asked
        self._transport = transport(options)
        self.binding: ModelBinding | None = None

    @property
    def _client(self):
        """tritonclient's client of the address (a load-test user that only infers never makes one)."""
        if self._made is None:
            self._made = self._tritonclient()
        return self._made

    def _tritonclient(self):
        options = self.options
        try:
            if options.protocol == "grpc":
                import tritonclient.grpc as module

                _no_second_close_at_exit(module.InferenceServerClient)
                return module.InferenceServerClient(
                    options.url, ssl=options.ssl, root_certificates=options.root_certificates
                )
            import tritonclient.http as module

            return module.InferenceServerClient(
                options.url, ssl=options.ssl, insecure=options.insecure,
                ssl_options={"ca_certs": options.root_certificates} if options.root_certificates else None,
                connection_timeout=options.timeout_s, network_timeout=options.timeout_s,
            )
        except Exception as exc:  # tritonclient raises assorted types for bad urls
            raise ConfigError(f"--triton-url {options.url!r}: {exc}") from None

    def connect(self) -> ModelBinding:
        """Read the model's metadata and pick its interface (one line on failure)."""
        try:
            meta = self._client.get_model_metadata(self.options.model, headers=self._headers, **self._as_json())
        except Exception as exc:
            hint = tls_hint(str(exc), self.options)
            raise ServerError(f"cannot read model {self.options.model!r} at {self.options.url} "
                              f"({self.options.protocol}): {_one_line(exc)}{hint}") from None
        inputs, outputs = _specs_from_metadata(meta["inputs"]), _specs_from_metadata(meta["outputs"])
        names = {t.name for t in outputs}
        binding = ModelBinding(match_interface(self.options.model, inputs, outputs), CACHED_TOKENS_OUTPUT in names,
                               CACHED_TOKENS_OUTPUT in names and HOST_CACHED_TOKENS_OUTPUT in names,
                               self._published_limits())
        self._check_access(binding)
        self.binding = binding
        return binding

    def _published_limits(self) -> Limits | None:
        """The limits the model's configuration publishes; None when it publishes none, or when the
        configuration cannot be read (a server may keep it closed: its refusals then say the limits)."""
        try:
            config = self._client.get_model_config(self.options.model, headers=self._headers, **self._as_json())
        except Exception:
            return None
        return published_limits(config)

    def _check_access(self, binding: ModelBinding) -> None:
        """Metadata can be open where inference is not: an inference request without inputs asks
        the server whether these credentials may infer, before any load. The server refuses the
        request itself (it lacks every input, so nothing is computed) unless it refuses the caller."""
        try:
            self._transport.infer((), binding.outputs)
        except AccessDenied as exc:
            raise AccessDenied(f"inference on {self.options.model!r} at {self.options.url} ({self.options.protocol}) "
                               f"refused: {exc} - check --triton-headers") from None
        except ServerError:
            pass  # the expected complaint about the missing inputs

    def infer(self, tensors: RequestTensors, route_key: int | None = None) -> InferResponse:
        """Send one request; raises ServerError (ServerUnavailable when the server was not there
        to take it) with one line on failure. With a route header, `route_key` goes in it."""
        binding = self.binding or self.connect()
        header = self.options.route_header
        extra = ((header, str(route_key)),) if header and route_key is not None else ()
        result, seconds = self._transport.infer(tensors.input_parts(binding.interface), binding.outputs, extra)
        logits = checked_output(result, binding.interface.logits_output, (tensors.num_logits, NUM_TASKS))
        cached = checked_output(result, CACHED_TOKENS_OUTPUT, (tensors.batch_size,)) if binding.reports_hits else None
        host = (checked_output(result, HOST_CACHED_TOKENS_OUTPUT, (tensors.batch_size,))
                if binding.reports_tiers else None)
        return InferResponse(logits, cached, seconds, host)

    def server_budgets(self) -> ServerBudgets | None:
        """The pools' budgets from the server's control model (`CONTROL_MODEL` with GPU_BUDGET_TOKENS and
        HOST_BUDGET_TOKENS, asked with CLEAR 0: nothing changes); None when it has no such model."""
        from hstu_replay.interface import CONTROL_MODEL

        try:
            meta = self._client.get_model_metadata(CONTROL_MODEL, headers=self._headers, **self._as_json())
            if not set(BUDGET_OUTPUTS) <= {t["name"] for t in meta["outputs"]}:
                return None
            module = importlib.import_module(f"tritonclient.{self.options.protocol}")
            clear = module.InferInput("CLEAR", [1], "INT64")
            clear.set_data_from_numpy(np.zeros(1, dtype=np.int64))
            result = self._client.infer(CONTROL_MODEL, [clear], headers=self._headers,
                                        outputs=[module.InferRequestedOutput(n) for n in BUDGET_OUTPUTS])
            return ServerBudgets(*(int(result.as_numpy(n).ravel()[0]) for n in BUDGET_OUTPUTS))
        except Exception:
            return None

    def server_statistics(self, model: str | None = None) -> dict:
        """Triton's per-model statistics (queue/compute split) as a dict; {} if not permitted."""
        try:
            return self._client.get_inference_statistics(model or self.options.model, headers=self._headers,
                                                         **self._as_json())
        except Exception:
            return {}

    def close(self) -> None:
        """Close explicitly: a gRPC channel left to __del__ can hang interpreter exit."""
        for part in (self._transport, self._made):
            if part is None:
                continue
            try:
                part.close()
            except Exception:
                pass

    def _as_json(self) -> dict:
        return {"as_json": True} if self.options.protocol == "grpc" else {}


def checked_output(result: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """One output of a response, checked against the shape the request implies (a malformed
    answer is a failed request, never a silently unverified one)."""
    array = result.get(name)
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


def tls_hint(message: str, options: ClientOptions) -> str:
    """What to check when a connection failed on TLS (an empty string otherwise)."""
    if "CERTIFICATE_VERIFY_FAILED" in message or "certificate verify failed" in message:
        return (" - the server's certificate is not signed by a CA in --triton-root-cert" if options.root_certificates
                else " - give the CA that signed the server's certificate with --triton-root-cert")
    if not options.ssl and ("Socket closed" in message or "connection closed" in message):
        return " - does the server take TLS only? (--triton-ssl)"
    if options.ssl and ("WRONG_VERSION_NUMBER" in message or "wrong version number" in message):
        return " - the server does not speak TLS on this port (leave out --triton-ssl)"
    return ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
