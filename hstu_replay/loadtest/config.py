"""A run's typed config: one frozen section per stage of the run, validated once when built.

`LoadTestConfig.from_options` reads Locust's parsed options (`loadtest.options`), folds the
address options into one target, and builds the sections; each section checks its own values
and the config checks what spans two of them. Every error names the option, the value and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit
from enum import StrEnum

from hstu_replay.arguments import batch_numbers, hit_ratio_numbers, numbers
from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.client.triton import ClientOptions
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits, history_tokens
from hstu_replay.fleet.routing import Routing, routing
from hstu_replay.loadtest.address import address_url, addresses, resolve_address
from hstu_replay.loadtest.options import SECRETS, option_values
from hstu_replay.plan.over_limit import HistoryPolicy
from hstu_replay.plan.reuse import PartialHits
from hstu_replay.plan.tier_mix import TierMix
from hstu_replay.plan.tiers import OFFLOAD_MODES
from hstu_replay.plan.workloads import WORKLOADS, WorkloadKind, natural_workloads, one_of, workload_kind
from hstu_replay.report.flags import StageRules
from hstu_replay.report.thresholds import Thresholds, parse_thresholds
from hstu_replay.verify import DEFAULT_TOLERANCE


class Arrival(StrEnum):
    """--arrival: how requests are paced."""

    CLOSED = "closed"  # back to back
    CONSTANT = "constant"  # open loop, evenly spaced
    POISSON = "poisson"  # open loop, exponential gaps

    @property
    def open(self) -> bool:
        return self is not Arrival.CLOSED


class TritonProtocol(StrEnum):
    GRPC = "grpc"
    HTTP = "http"


class GrpcTransport(StrEnum):
    """--triton-grpc-transport: what carries gRPC inference requests (client.triton.GRPC_TRANSPORTS)."""

    H2 = "h2"
    GRPCIO = "grpcio"


def _choice(enum: type[StrEnum], flag: str, value: str, message: str | None = None):
    try:
        return enum(value)
    except ValueError:
        raise ConfigError(message or f"{flag} {value!r}: use one of {', '.join(e.value for e in enum)}") from None


@dataclass(frozen=True)
class TargetConfig:
    """Where requests go and how (--host / --triton-*)."""

    address: str  # host:port; a fleet's, joined by commas
    protocol: TritonProtocol
    ssl: bool
    model: str
    root_cert: str
    headers: str = field(repr=False)  # secret: 'name=value,...'
    timeout_s: float = 30.0
    grpc_transport: GrpcTransport = GrpcTransport.H2
    routing: Routing = Routing.KEY_HASH  # which server of a fleet each request goes to
    routing_header: str = ""  # a header carrying each request's route key (for a gateway)
    fleet_metrics: tuple[str, ...] = ()  # behind a gateway: each server's KV-cache metrics URL

    def __post_init__(self):
        self.header_map()  # a malformed item is named before the run (its value never is)

    @property
    def addresses(self) -> tuple[str, ...]:
        """Each server's host:port, in the fleet's order (one for a single server)."""
        return addresses(self.address)

    @property
    def url(self) -> str:
        """The address as a URL (what Locust's Host field shows)."""
        return address_url(self.address, self.protocol.value, self.ssl)

    def header_map(self) -> dict[str, str]:
        headers = {}
        for part in filter(None, (p.strip() for p in self.headers.split(","))):
            name, sep, value = part.partition("=")
            if not sep or not name.strip():
                raise ConfigError(f"--triton-headers: item {len(headers) + 1} is not name=value (value not shown)")
            headers[name.strip()] = value.strip()
        return headers

    def client_options(self, server: int = 0) -> ClientOptions:
        """How to reach server `server` of the fleet (the first, or the only one)."""
        return ClientOptions(url=self.addresses[server], protocol=self.protocol.value, model=self.model,
                             ssl=self.ssl, root_certificates=self.root_cert or None, headers=self.header_map(),
                             timeout_s=self.timeout_s, grpc_transport=self.grpc_transport.value,
                             route_header=self.routing_header)


@dataclass(frozen=True)
class DataConfig:
    """What is replayed (--workload and its data, the request limits, natural replay's pacing)."""

    kind: WorkloadKind
    store: str
    dump_dir: str
    candidates: int
    max_history: int
    max_values: int
    seed: int
    time_scale: float = 0.0
    time_slice_ms: int = 0
    shard: tuple[int, int] = (0, 1)  # --timeline-shard i/n; (0, 1): every user
    policy: HistoryPolicy = HistoryPolicy()  # --over-limit, --rebase-keep
    working_set: int = 0  # --working-set: keys per virtual user revisited round-robin (0: off)
    partial_hits: PartialHits = PartialHits.PRIME  # --partial-hits: ratios between 0 and 1 from primes or reuse

    def __post_init__(self):
        if not getattr(self, self.kind.data_option):
            raise ConfigError(f"--workload {self.kind.name} needs {self.kind.data_needed}")
        if self.partial_hits is PartialHits.REUSE and not self.kind.mixes_hits:
            raise ConfigError(f"--partial-hits {self.partial_hits}: only --workload "
                              f"{one_of(k.name for k in WORKLOADS.values() if k.mixes_hits)} mixes full hits and misses")
        if self.time_scale < 0 or self.time_slice_ms < 0:
            raise ConfigError(f"--time-scale {self.time_scale} / --time-slice-ms {self.time_slice_ms}: use 0 or more")
        if self.time_scale > 0 and not self.kind.natural:
            raise ConfigError(f"--time-scale replays the log's own times: only with --workload {natural_workloads()}")
        if self.shard != (0, 1) and not self.kind.natural:
            raise ConfigError(f"--timeline-shard splits a natural replay's users: only with --workload "
                              f"{natural_workloads()}")
        if not 1 <= self.candidates <= self.limits.max_candidates:
            raise ConfigError(f"--candidates {self.candidates}: use 1..{self.limits.max_candidates} "
                              "(the published model's limit)")
        if self.max_history < 1 or self.max_values < 1:
            raise ConfigError(f"--max-history {self.max_history} / --max-values {self.max_values}: at least 1")

    @property
    def workload(self) -> str:
        return self.kind.name

    @property
    def path(self) -> str:
        """The store or dump directory the workload reads."""
        return getattr(self, self.kind.data_option)

    @property
    def limits(self) -> Limits:
        return Limits(max_history=self.max_history, max_values=self.max_values)


@dataclass(frozen=True)
class CacheConfig:
    """The server's KV cache, as the client's cache model sees it: a GPU pool and a host pool behind
    it (NVIDIA's two tiers), and the tier mix a sessions run is steered to."""

    budget_tokens: int = 0  # GPU pool; 0: unbounded
    page_tokens: int = DEFAULT_PAGE_TOKENS
    host_budget_tokens: int = 0  # 0: no host tier
    offload_mode: str = "native"
    tier_mix: TierMix | None = None
    offload_chunk_tokens: int = DEFAULT_OFFLOAD_CHUNK_TOKENS  # the server's native offload chunk
    fleet_budgets: tuple[int, ...] = ()  # each server's GPU pool, in the fleet's order (empty: budget_tokens)

    def __post_init__(self):
        if any(b < 0 for b in self.fleet_budgets):
            raise ConfigError(f"--fleet-budgets {','.join(map(str, self.fleet_budgets))}: use 0 or more tokens")
        if self.budget_tokens < 0 or self.host_budget_tokens < 0:
            raise ConfigError(f"--cache-budget-tokens {self.budget_tokens} / --host-budget-tokens "
                              f"{self.host_budget_tokens}: use 0 or more tokens")
        if self.offload_mode not in OFFLOAD_MODES:
            raise ConfigError(f"--offload-mode {self.offload_mode!r}: use {one_of(OFFLOAD_MODES)}")
        if self.offload_chunk_tokens < 1:
            raise ConfigError(f"--offload-chunk-tokens {self.offload_chunk_tokens}: must be at least 1")

    @property
    def budgets_given(self) -> bool:
        return bool(self.budget_tokens or self.host_budget_tokens or self.fleet_budgets)

    def gpu_budgets(self, servers: int) -> tuple[int, ...]:
        """Each server's GPU pool in tokens (0: unbounded)."""
        return self.fleet_budgets or (self.budget_tokens,) * servers

    def check_mix(self) -> None:
        """Whether the pools (given, or read from the server) let the tier mix be met."""
        mix = self.tier_mix
        if mix is None:
            return
        if (mix.host or mix.miss) and self.budget_tokens <= 0:
            raise ConfigError(f"--tier-mix {mix_text(mix)}: host hits and misses need a bounded GPU pool "
                              "(--cache-budget-tokens)")
        if mix.host and self.host_budget_tokens <= self.budget_tokens:
            raise ConfigError(f"--tier-mix {mix_text(mix)}: host hits need --host-budget-tokens "
                              f"({self.host_budget_tokens}) above --cache-budget-tokens ({self.budget_tokens}): "
                              "the host pool holds copies of the GPU's users too")


def check_working_set(size: int, kind: WorkloadKind, cache: CacheConfig, sweep: SweepConfig) -> None:
    """--working-set: sessions only, not with a tier mix, every visit after the first a full revisit."""
    if not size:
        return
    if size < 0:
        raise ConfigError(f"--working-set {size}: give a number of keys, 1 or more (0: off)")
    if not kind.steers_tiers:
        raise ConfigError(f"--working-set {size}: only --workload "
                          f"{one_of(k.name for k in WORKLOADS.values() if k.steers_tiers)} revisits a working set")
    if cache.tier_mix is not None:
        raise ConfigError(f"--working-set {size}: the tiers follow from the working set; leave out --tier-mix")
    if sweep.ratios != (1.0,):
        raise ConfigError(f"--working-set {size}: every visit revisits its key whole: give --hit-ratios 1, "
                          f"not {','.join(f'{r:g}' for r in sweep.ratios)}")


def mix_text(mix: TierMix) -> str:
    return ",".join(f"{name}:{share:g}" for name, share in mix.as_dict().items())


@dataclass(frozen=True)
class SweepConfig:
    """The stages and how load is offered in them."""

    ratios: tuple[float, ...]
    batches: tuple[int, ...]
    arrival: Arrival
    request_rate: float
    stage_seconds: float
    stage_requests: int
    warmup_seconds: float

    def __post_init__(self):
        if self.arrival.open and self.request_rate <= 0:
            raise ConfigError(f"--arrival {self.arrival} needs --request-rate > 0")
        if self.stage_requests < 0:
            raise ConfigError(f"--stage-requests {self.stage_requests}: use 0 (off) or a count")
        if self.stage_seconds <= 0 or self.warmup_seconds < 0:
            raise ConfigError("--stage-seconds must be > 0 and --warmup-seconds >= 0")

    @property
    def open_rate(self) -> float:
        """Requests per second of an open loop; 0 when closed."""
        return self.request_rate if self.arrival.open else 0.0


@dataclass(frozen=True)
class CheckConfig:
    """How responses are verified against the references."""

    verify_fraction: float = 1.0
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self):
        if not 0.0 <= self.verify_fraction <= 1.0:
            raise ConfigError(f"--verify-fraction {self.verify_fraction}: use 0..1")


@dataclass(frozen=True)
class ReportConfig:
    """Where the report goes, what flags a stage, and the CI thresholds."""

    report_dir: str
    rules: StageRules
    thresholds: Thresholds


@dataclass(frozen=True)
class LoadTestConfig:
    target: TargetConfig
    data: DataConfig
    cache: CacheConfig
    sweep: SweepConfig
    checks: CheckConfig
    report: ReportConfig
    options: dict  # every option as given (the address resolved), secrets left out: report.json's "options"

    def __post_init__(self):
        if self.data.time_scale > 0 and self.sweep.arrival.open:
            raise ConfigError("--time-scale sets the send times itself: leave --arrival closed")
        mix = self.cache.tier_mix
        if mix is not None and mix.host and self.cache.offload_mode == "native":
            longest = max(history_tokens(self.data.limits.history_cap(b, self.data.candidates))
                          for b in self.sweep.batches)
            chunk = self.cache.offload_chunk_tokens
            if longest < chunk:
                raise ConfigError(f"--tier-mix {mix_text(mix)}: under --offload-mode native a history reaches the "
                                  f"host only once it has {chunk:,} tokens, and the longest sent here "
                                  f"has {longest} (--max-history {self.data.max_history}): give longer histories, "
                                  "or --offload-mode flexkv where the server offloads after every forward")

    def with_budgets(self, gpu_tokens: int, host_tokens: int, fleet: tuple[int, ...] = ()) -> LoadTestConfig:
        """The config with the pools' budgets a server said (options left unset), checked; `fleet`:
        each server's GPU pool, where a fleet's servers said theirs."""
        cache = replace(self.cache, budget_tokens=gpu_tokens, host_budget_tokens=host_tokens, fleet_budgets=fleet)
        cache.check_mix()
        options = dict(self.options, cache_budget_tokens=gpu_tokens, host_budget_tokens=host_tokens)
        if fleet:
            options["fleet_budgets"] = ",".join(map(str, fleet))
        return replace(self, cache=cache, options=options)

    @classmethod
    def from_options(cls, parsed, host: str | None = None, secrets: dict | None = None) -> LoadTestConfig:
        """The config of Locust's parsed options; `host` is Locust's --host / Host field (the
        target address), `secrets` the values kept out of the options (see `options.take_secrets`)."""
        values = option_values(parsed, secrets)
        address = resolve_address(host, values["triton_url"], values["triton_protocol"], values["triton_ssl"])
        values["triton_url"], values["triton_protocol"], values["triton_ssl"] = address
        return cls.from_values(values)

    @classmethod
    def from_values(cls, v: dict) -> LoadTestConfig:
        """The config of typed option values (`options.option_values`), checked."""
        sweep = SweepConfig(ratios=_ratios(v["hit_ratios"]), batches=_batches(v["batch_sizes"]),
                            arrival=_choice(Arrival, "--arrival", v["arrival"]), request_rate=v["request_rate"],
                            stage_seconds=v["stage_seconds"], stage_requests=v["stage_requests"],
                            warmup_seconds=v["warmup_seconds"])
        kind = workload_kind(v["workload"])
        data = DataConfig(kind=kind, store=v["store"], dump_dir=v["dump_dir"], candidates=v["candidates"],
                          max_history=v["max_history"], max_values=v["max_values"], seed=v["seed"],
                          time_scale=v["time_scale"], time_slice_ms=v["time_slice_ms"],
                          shard=_shard(v["timeline_shard"]), policy=HistoryPolicy.of(v["over_limit"], v["rebase_keep"]),
                          working_set=v["working_set"],
                          partial_hits=_choice(PartialHits, "--partial-hits", v["partial_hits"]))
        checks = CheckConfig(v["verify_fraction"], v["tolerance"])
        cache = CacheConfig(budget_tokens=v["cache_budget_tokens"], page_tokens=v["cache_page_tokens"],
                            host_budget_tokens=v["host_budget_tokens"], offload_mode=v["offload_mode"],
                            tier_mix=TierMix.parse(v["tier_mix"]) if v["tier_mix"] else None,
                            offload_chunk_tokens=v["offload_chunk_tokens"], fleet_budgets=_budgets(v["fleet_budgets"]))
        if cache.budgets_given:
            cache.check_mix()  # else once the server's control model said its budgets (loadtest.prepare)
        if cache.tier_mix is not None and not kind.steers_tiers:
            raise ConfigError(f"--tier-mix {v['tier_mix']!r}: only --workload "
                              f"{one_of(k.name for k in WORKLOADS.values() if k.steers_tiers)} steers by tier")
        check_working_set(v["working_set"], kind, cache, sweep)
        if v["min_stage_requests"] < 1 or v["max_loop_lag_ms"] <= 0:
            raise ConfigError("--min-stage-requests must be >= 1 and --max-loop-lag-ms > 0")
        if v["master_timeout"] <= 0:
            raise ConfigError(f"--master-timeout {v['master_timeout']}: give seconds > 0")
        protocol = _choice(TritonProtocol, "--triton-protocol", v["triton_protocol"],
                           f"--triton-protocol {v['triton_protocol']!r}: use {one_of(p.value for p in TritonProtocol)}")
        target = TargetConfig(address=v["triton_url"], protocol=protocol, ssl=v["triton_ssl"], model=v["triton_model"],
                              root_cert=v["triton_root_cert"], headers=v["triton_headers"],
                              timeout_s=v["triton_timeout"],
                              grpc_transport=_choice(GrpcTransport, "--triton-grpc-transport",
                                                     v["triton_grpc_transport"]),
                              routing=routing(v["routing"]), routing_header=v["routing_header"],
                              fleet_metrics=_metrics_urls(v["fleet_metrics"]))
        target.client_options()  # the client's own checks
        if target.fleet_metrics and len(target.addresses) > 1:
            raise ConfigError("--fleet-metrics names the servers behind one gateway address: give one --host, "
                              f"not {len(target.addresses)}")
        if cache.fleet_budgets and len(cache.fleet_budgets) != len(target.addresses):
            raise ConfigError(f"--fleet-budgets gives {len(cache.fleet_budgets)} budgets for a fleet of "
                              f"{len(target.addresses)} servers (--host): one per server, in its order")
        report = ReportConfig(
            v["report_dir"], StageRules(v["min_stage_requests"], cache.page_tokens,
                                        loop_lag_bound_ms=v["max_loop_lag_ms"],
                                        tier_mix=tuple(cache.tier_mix.as_dict().items()) if cache.tier_mix else ()),
            parse_thresholds(None if v["max_mismatches"] < 0 else v["max_mismatches"],
                             None if v["max_error_ratio"] < 0 else v["max_error_ratio"],
                             v["max_p99_ms"], v["min_speedup"],
                             None if v["max_workers_lost"] < 0 else v["max_workers_lost"]))
        options = {name: value for name, value in v.items() if name not in SECRETS}
        return cls(target, data, cache, sweep, checks, report, options)


def _given(flag: str, values: tuple) -> tuple:
    if not values:
        raise ConfigError(f"{flag} is empty")
    return values


def _ratios(text: str) -> tuple[float, ...]:
    return _given("--hit-ratios", hit_ratio_numbers("--hit-ratios", text, blanks=True))


def _batches(text: str) -> tuple[int, ...]:
    return _given("--batch-sizes", batch_numbers("--batch-sizes", text, blanks=True))


def _metrics_urls(text: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in text.split(",")) if text.strip() else ()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"--fleet-metrics {url!r}: give each server's metrics page, http://host:port/metrics")
    if len(set(urls)) < len(urls):
        raise ConfigError("--fleet-metrics: a server's metrics page is given twice")
    return urls


def _budgets(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in numbers("--fleet-budgets", text, 0, integral=True, digits=True,
                                         form="token counts, one per server")) if text else ()


def _shard(text: str) -> tuple[int, int]:
    """(i, n) of --timeline-shard; (0, 1): every user."""
    if not text:
        return 0, 1
    i, sep, n = str(text).partition("/")
    try:
        shard = int(i), int(n)
    except ValueError:
        shard = (-1, 0)
    if not sep or not 0 <= shard[0] < shard[1]:
        raise ConfigError(f"--timeline-shard {text!r}: give i/n with 0 <= i < n, e.g. 0/2")
    return shard
