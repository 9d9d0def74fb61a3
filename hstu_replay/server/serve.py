"""Serve the reference target on a real tritonserver (the one bundled with nvidia-pytriton).

Models hosted, each with the published tensor names, dtypes and dims:
- `hstu_gr_ranking_kvcache` (5 inputs) backed by the per-user KV cache; extra outputs
  `CACHED_TOKENS` (INT64 [B], tokens each user reused, both tiers) are evidence of hits for any
  client, `HOST_CACHED_TOKENS` (INT64 [B]) the part of them onboarded from the host tier;
- `hstu_gr_ranking` (3 inputs), no cache;
- `hstu_model` (the older Python-backend interface, 4 inputs), no cache;
- `hstu_kvcache_control`: reads the cache counters (both tiers, memory), and empties the cache when CLEAR is 1.
Prometheus counters of cached vs computed tokens are served on their own port (default 8003),
beside Triton's own /metrics (8002).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import ssl
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hstu_replay.errors import ConfigError, ServerError
from hstu_replay.interface import (
    CONTROL_MODEL, DEFAULT_CACHE_METRICS_PORT, DEFAULT_GRPC_PORT, DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT, KVCACHE,
    NOCACHE, PYTHON_BACKEND, Limits, ModelInterface,
)
from hstu_replay.metrics.pages import SERVER_INFO
from hstu_replay.request import RequestTensors
from hstu_replay.server.phases import NO_CLOCK, PhaseClock
from hstu_replay.server.tls_proxy import TlsFiles, TlsForwarder

if TYPE_CHECKING:  # torch: `server serve` builds its config from this module before the model's threads are set
    from hstu_replay.server.batched import BatchedEngine
    from hstu_replay.server.engine import PackagedRanker, RankingEngine

CONTROL_OUTPUTS = ("HIT_TOKENS", "COMPUTED_TOKENS", "EVICTED_USERS", "RESIDENT_TOKENS", "REQUESTS",
                   # the host tier (HIT_TOKENS stays both tiers' total) and the KV memory
                   "HOST_HIT_TOKENS", "HOST_RESIDENT_TOKENS", "ONBOARDED_BYTES", "ONBOARD_MICROS", "OFFLOADED_BYTES",
                   "OFFLOAD_MICROS", "GPU_BUDGET_TOKENS", "HOST_BUDGET_TOKENS", "RESIDENT_BYTES", "BUDGET_BYTES",
                   "HOST_EVICTED_USERS", "HOST_RESIDENT_BYTES", "HOST_BUDGET_BYTES")
#: /metrics of the cache-metrics port: (stats key, Prometheus type, help); counters get `_total`
CACHE_METRICS = (
    ("hit_tokens", "counter", "History tokens reused from the KV cache (both tiers)"),
    ("computed_tokens", "counter", "History tokens computed (not found in the KV cache)"),
    ("evicted_users", "counter", "Users evicted from the KV cache's primary pool"),
    ("requests", "counter", "Requests served by the KV-cache model"),
    ("host_hit_tokens", "counter", "History tokens reused by onboarding them from the host tier"),
    ("onboarded_bytes", "counter", "K/V bytes copied from the host tier into the primary pool"),
    ("onboard_micros", "counter", "Microseconds spent onboarding from the host tier"),
    ("offloaded_bytes", "counter", "K/V bytes copied from the primary pool to the host tier"),
    ("offload_micros", "counter", "Microseconds spent offloading to the host tier"),
    ("host_evicted_users", "counter", "Users evicted from the host tier"),
    ("resident_tokens", "gauge", "Tokens held in the KV cache's primary pool"),
    ("host_resident_tokens", "gauge", "Tokens held in the host tier"),
    ("gpu_budget_tokens", "gauge", "Budget of the primary pool in tokens (-1: unbounded)"),
    ("host_budget_tokens", "gauge", "Budget of the host tier in tokens (0: no host tier)"),
    ("resident_bytes", "gauge", "KV memory the primary pool holds now"),
    ("budget_bytes", "gauge", "KV memory of the primary pool at its full size (-1: unbounded)"),
    ("host_resident_bytes", "gauge", "K/V bytes held in the host tier"),
    ("host_budget_bytes", "gauge", "Budget of the host tier in bytes"),
)
#: A stop unloads every model through Triton's repository API first (each waits for its in-flight
#: requests), within this many seconds; tritonserver then waits at most EXIT_TIMEOUT_S for clients'
#: open connections. At its default 30 s, one load-test client still connected held the stop that
#: long, and then tritonserver killed the models' stubs (non-graceful, leaking shared memory).
UNLOAD_WAIT_S = 3.0
EXIT_TIMEOUT_S = 3
#: Triton endpoints behind PyTriton's access token; statistics stay open for load-test clients.
PROTECTED_ENDPOINTS = ["shared-memory", "model-repository", "trace", "logging"]
ACCESS_HEADER = "triton-access-token"  # the header PyTriton's own clients send with the token
#: Triton checks a restricted gRPC protocol's header as metadata under this prefix + the name.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
_HEADER_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")  # lower case: gRPC metadata keys must be
_HEADER_VALUE = re.compile(r"[!-~]+")  # visible ASCII: tritonserver's arguments are split on spaces


@dataclass(frozen=True)
class RequiredHeader:
    """A header every inference request must carry (`--require-header name=value`): Triton's own
    restricted-API check answers the others with an error. The value is a secret: never printed."""

    name: str
    value: str

    @classmethod
    def parse(cls, text: str) -> RequiredHeader:
        name, sep, value = text.partition("=")
        name = name.strip().lower()
        if not sep or not _HEADER_NAME.fullmatch(name) or not _HEADER_VALUE.fullmatch(value):
            raise ConfigError("--require-header: give name=value (a name of letters, digits, '-', '_' or '.'; "
                              "a value of visible characters without spaces)")
        return cls(name, value)

    def __repr__(self) -> str:  # never the value
        return f"RequiredHeader({self.name!r}, <hidden>)"


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    cache_metrics_port: int = DEFAULT_CACHE_METRICS_PORT
    log_verbose: int = 0
    tls: TlsFiles | None = None  # gRPC then takes TLS only, and `https_port` serves HTTPS
    https_port: int = 0  # 0: no HTTPS; else Triton's HTTP port stays on loopback behind a TLS forwarder
    required_header: RequiredHeader | None = None  # inference needs it, on every protocol
    #: the ranking models' configurations publish the model's limits (`interface.LIMIT_PARAMETERS`);
    #: off, they carry none, as NVIDIA's published server's do
    publish_limits: bool = True

    def __post_init__(self):
        if self.https_port and self.tls is None:
            raise ConfigError("--https-port needs --tls-cert and --tls-key")
        if self.tls is not None:
            for flag, path in (("--tls-cert", self.tls.cert), ("--tls-key", self.tls.key)):
                if not os.path.isfile(path):
                    raise ConfigError(f"{flag} {path!r}: no such file")
            try:
                self.tls.server_context()
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"--tls-cert/--tls-key: not a usable PEM certificate and key ({exc})") from None

    @property
    def http_host(self) -> str:
        """Where Triton's plain HTTP listens: loopback alone when HTTPS stands in front of it."""
        return ("::1" if ":" in self.host else "127.0.0.1") if self.https_port else self.host

    @property
    def ports(self) -> dict[str, int]:
        ports = {
            "http": self.http_port,
            "grpc": self.grpc_port,
            "metrics": self.metrics_port,
            "cache metrics": self.cache_metrics_port,
        }
        return ports | ({"https": self.https_port} if self.https_port else {})

    def restrictions(self, access_token: str) -> list[str]:
        """tritonserver's `--{grpc-restricted-protocol,http-restricted-api}` values: PyTriton's
        token on the management endpoints, and the required header on inference."""
        rules = [f"{','.join(PROTECTED_ENDPOINTS)}:{ACCESS_HEADER}={access_token}"]
        if self.required_header is not None:
            rules.append(f"inference:{self.required_header.name}={self.required_header.value}")
        return rules

    def describe(self) -> str:
        """The line printed once serving (addresses and what they require; never a secret)."""
        grpc = f"grpc {self.grpc_port}{' (TLS)' if self.tls else ''}"
        http = f"http {self.http_port}" + (f" on {self.http_host}, https {self.https_port}" if self.https_port else "")
        text = (f"serving on {self.host}: {grpc}, {http}, metrics {self.metrics_port}, "
                f"cache metrics {self.cache_metrics_port}")
        if self.required_header is not None:
            name = self.required_header.name
            text += f"; inference requires header {name} (gRPC metadata {GRPC_HEADER_PREFIX}{name})"
        return text


@dataclass(frozen=True)
class Engines:
    """Anything with `infer(RequestTensors) -> InferResult`; `cached` also `cache.stats()` and `clear_cache()`."""

    cached: RankingEngine | BatchedEngine  # hstu_gr_ranking_kvcache
    uncached: PackagedRanker | BatchedEngine  # hstu_gr_ranking and hstu_model: no cache kept


def check_ports_free(options: ServeOptions) -> None:
    """Fail early, in one line, when a port is taken (tritonserver would only log it)."""
    for name, port in options.ports.items():
        host = options.http_host if name == "http" else options.host
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            # as tritonserver does: connections still in TIME_WAIT do not make a port "taken"
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise ServerError(
                    f"{name} port {port} on {host} is taken ({exc.strerror}); choose another with --{name.replace(' ', '-')}-port"
                ) from None


def infer_outputs(engine: RankingEngine, inputs: Mapping[str, np.ndarray], interface: ModelInterface,
                  with_cache_outputs: bool, clock: PhaseClock = NO_CLOCK) -> dict[str, np.ndarray]:
    """One request of a ranking model: its input tensors in, its output tensors out (every frontend's)."""
    with clock.phase("request"):
        tensors = RequestTensors.from_inputs(inputs, interface)
    with clock.phase("engine"):
        result = engine.infer(tensors)
    outputs = {interface.logits_output: result.logits}
    if with_cache_outputs:
        outputs["OUTPUT__1"] = np.full(tensors.batch_size, -1, dtype=np.int64)
        outputs["CACHED_TOKENS"] = result.cached_tokens.astype(np.int64)
        outputs["HOST_CACHED_TOKENS"] = result.host_cached_tokens.astype(np.int64)
    return outputs


def limit_parameters(limits: Limits, options: ServeOptions) -> dict[str, str]:
    """The parameters a ranking model's configuration carries for its limits (none when not published)."""
    return limits.parameters() if options.publish_limits else {}


def _publish_parameters(triton, models: Collection[str], parameters: Mapping[str, str]) -> None:
    """PyTriton's ModelConfig has no `parameters`: they go into the configuration it generates for
    each bound model (its backend parameters, which Triton serves as the model's `parameters`),
    before the models are loaded (bound before the server starts, they load when it does)."""
    if not parameters:
        return
    try:
        bound = {model.model_name: model for model in triton._model_manager.models}
        for name in models:
            bound[name]._get_triton_model_config().backend_parameters.update(parameters)
    except (AttributeError, KeyError) as exc:
        raise ServerError(f"this nvidia-pytriton cannot publish the model's limits in its configuration ({exc}); "
                          "serve with --frontend python-backend or cpp-backend") from None


def wants_clear(clear: np.ndarray) -> bool:
    return int(np.asarray(clear).ravel()[0]) == 1


def control_outputs(stats: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The control model's answer from the cache's counters (every frontend's)."""
    return {name: np.array([stats[name.lower()]], dtype=np.int64) for name in CONTROL_OUTPUTS}


def _logits_handler(engine: RankingEngine, interface: ModelInterface, with_cache_outputs: bool) -> Callable:
    def infer(requests):
        return [infer_outputs(engine, {k: request[k] for k in request}, interface, with_cache_outputs)
                for request in requests]

    return infer


def _control_handler(engine: RankingEngine) -> Callable:
    def infer(requests):
        responses = []
        for request in requests:
            if wants_clear(request["CLEAR"]):
                engine.clear_cache()
            responses.append(control_outputs(engine.cache.stats()))
        return responses

    return infer


class CacheCollector(Collector):
    """The KV cache's counters and gauges (`CACHE_METRICS`), read from the cache at each scrape."""

    def __init__(self, engine: RankingEngine):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.cache.stats()
        for key, kind, help_text in CACHE_METRICS:
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily  # a counter gets `_total`
            yield family(f"hstu_kvcache_{key}", help_text, value=stats[key])


class ServerInfoCollector(Collector):
    """`SERVER_INFO`: the server's addresses as labels of a gauge of 1 (which server a page is)."""

    def __init__(self, options: ServeOptions):
        self.labels = {"grpc": f"{options.host}:{options.grpc_port}", "http": f"{options.host}:{options.http_port}"}

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(SERVER_INFO, "The reference server's addresses (labels); always 1",
                                   labels=list(self.labels))
        family.add_metric(list(self.labels.values()), 1)
        yield family


def start_cache_metrics(engine: RankingEngine, options: ServeOptions) -> WSGIServer:
    """The cache-metrics port: prometheus_client's exposition of `CacheCollector` and
    `ServerInfoCollector`, in a thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CacheCollector(engine))
    registry.register(ServerInfoCollector(options))
    server, _ = start_http_server(options.cache_metrics_port, options.host, registry)
    return server


def python_backend_env() -> None:
    """The backend stub links the system libpython; put the running interpreter's first."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and not current.startswith(libdir):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{current}" if current else libdir


def run_until_stopped(alive: Callable[[], bool], stop: threading.Event) -> None:
    """Serve until `stop` is set; a tritonserver gone meanwhile is an error."""
    while not stop.wait(0.5):
        if not alive():
            raise ServerError("tritonserver exited unexpectedly; see its log above")


def unload_models(options: ServeOptions, headers: dict[str, str], names: list[str], wait_s: float = UNLOAD_WAIT_S) -> None:
    """Every model asked to unload at once through Triton's repository API, each waiting for its
    in-flight requests (PyTriton stops tritonserver as the first one goes), for at most `wait_s`."""
    import tritonclient.http as http
    from tritonclient.utils import InferenceServerException

    host = f"[{options.http_host}]" if ":" in options.http_host else options.http_host

    def unload(name: str) -> None:
        try:
            with http.InferenceServerClient(f"{host}:{options.http_port}", connection_timeout=wait_s,
                                            network_timeout=wait_s) as client:
                client.unload_model(name, headers=headers)
        except (InferenceServerException, OSError):
            pass  # tritonserver's own stop deals with it

    threads = [threading.Thread(target=unload, args=(name,), daemon=True) for name in names]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + wait_s
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))


def serve(engines: Engines, options: ServeOptions, stop: threading.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop` is set); returns after a clean shutdown."""
    check_ports_free(options)
    python_backend_env()
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    stop = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def tensors(specs) -> list:
        dtypes = {"INT64": np.int64, "FP32": np.float32}
        return [Tensor(name=t.name, dtype=dtypes[t.dtype], shape=t.dims) for t in specs]

    extra = tensors(KVCACHE.extensions)
    unbatched = ModelConfig(batching=False)
    # The restrictions are written here rather than by PyTriton, which writes one rule only:
    # the required header on inference is a second one. PyTriton's clients still send the token.
    token = secrets.token_urlsafe(32)
    rules = options.restrictions(token)
    tls = options.tls
    config = TritonConfig(
        http_address=options.http_host, http_port=options.http_port,
        grpc_address=options.host, grpc_port=options.grpc_port,
        metrics_address=options.host, metrics_port=options.metrics_port,
        log_verbose=options.log_verbose, exit_on_error=True, exit_timeout_secs=EXIT_TIMEOUT_S,
        grpc_restricted_protocol=rules, http_restricted_api=rules,  # each rule one flag
        grpc_use_ssl=tls is not None or None, grpc_server_cert=tls and tls.cert, grpc_server_key=tls and tls.key,
    )
    security = TritonSecurityConfig(access_token=token, restricted_endpoints=[])
    started = time.monotonic()
    metrics = start_cache_metrics(engines.cached, options)
    https = None
    try:
        if options.https_port:
            https = TlsForwarder(options.host, options.https_port, (options.http_host, options.http_port), tls)
        triton = Triton(config=config, security_config=security)  # the models are bound before it starts
        triton.bind(KVCACHE.model_name, _logits_handler(engines.cached, KVCACHE, True),
                    inputs=tensors(KVCACHE.inputs), outputs=tensors(KVCACHE.outputs) + extra, config=unbatched)
        for interface in (NOCACHE, PYTHON_BACKEND):
            triton.bind(interface.model_name, _logits_handler(engines.uncached, interface, False),
                        inputs=tensors(interface.inputs), outputs=tensors(interface.outputs), config=unbatched)
        _publish_parameters(triton, [i.model_name for i in (KVCACHE, NOCACHE, PYTHON_BACKEND)],
                            limit_parameters(engines.cached.config.limits, options))
        triton.bind(CONTROL_MODEL, _control_handler(engines.cached),
                    inputs=[Tensor(name="CLEAR", dtype=np.int64, shape=(1,))],
                    outputs=[Tensor(name=n, dtype=np.int64, shape=(1,)) for n in CONTROL_OUTPUTS],
                    config=unbatched)
        with triton:
            triton.run()
            print(f"hstu-replay: {options.describe()} (ready in {time.monotonic() - started:.1f} s)", flush=True)
            run_until_stopped(triton.is_alive, stop)
            unload_models(options, {ACCESS_HEADER: token}, [KVCACHE.model_name, NOCACHE.model_name,
                                                            PYTHON_BACKEND.model_name, CONTROL_MODEL])
    except OSError as exc:
        raise ServerError(f"tritonserver failed to start: {exc}") from None
    finally:
        if https is not None:
            https.close()
        metrics.shutdown()
        print("hstu-replay: server stopped", file=sys.stderr, flush=True)
