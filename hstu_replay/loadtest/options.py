"""Every load-test option, declared once: its Locust argument, default, help and validation.

Locust shows them in the web UI and reads them from the command line, `locust.conf` and
`LOCUST_<NAME>` environment variables. `LoadTestConfig.from_options` reads them once into a
frozen, validated config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from hstu_replay.client.triton import ClientOptions
from hstu_replay.errors import ConfigError
from hstu_replay.interface import Limits


ARRIVALS = ("closed", "constant", "poisson")


def _opt(flag: str, default, help_text: str, secret: bool = False, arg_default=None):
    """One option; `arg_default` is the command line's default where it differs (unset)."""
    return field(default=default, repr=not secret,
                 metadata={"flag": flag, "help": help_text, "secret": secret,
                           "arg_default": default if arg_default is None else arg_default})


# What the web form may change. Paths only below --web-paths-root, the target address only with
# --web-edit-target, secrets never (they are not sent to the page nor taken from a form).
PATH_OPTIONS = ("triton_root_cert", "store", "dump_dir", "report_dir")
ADDRESS_OPTIONS = ("triton_url", "triton_protocol", "triton_ssl")

# Option groups, in the order the web form lists them (each help text starts with its group);
# an option listed in none is in DEFAULT_GROUP.
GROUPS = {
    "Data": ("workload", "store", "dump_dir", "candidates", "max_history", "max_values", "seed"),
    "Natural replay (--workload timeline)": ("time_scale", "time_slice_ms", "timeline_shard"),
    "Sweep and load": (),
    "Server cache": ("cache_budget_tokens", "cache_page_tokens"),
    "Checks and report": ("verify_fraction", "tolerance", "max_mismatches", "max_error_ratio", "max_p99_ms",
                          "min_speedup", "min_stage_requests", "max_loop_lag_ms", "report_dir"),
    "Target (the address is the Host field)": ("triton_model", "triton_timeout", "triton_root_cert", "triton_url",
                                               "triton_protocol", "triton_ssl", "triton_headers"),
}
DEFAULT_GROUP = "Sweep and load"
DEFAULT_ADDRESS = "127.0.0.1:8001"
SCHEMES = {"grpc": ("grpc", False), "grpcs": ("grpc", True), "http": ("http", False), "https": ("http", True)}


@dataclass(frozen=True)
class LoadTestConfig:
    triton_url: str = _opt("--triton-url", DEFAULT_ADDRESS, "Alias of --host: the Triton address, "
                           "grpc://host:8001, http://host:8000, https:// or grpcs:// for TLS, or host:port",
                           arg_default="")
    triton_protocol: str = _opt("--triton-protocol", "grpc", "grpc or http, for an address without a scheme")
    triton_model: str = _opt("--triton-model", "hstu_gr_ranking_kvcache", "Model name; its interface is detected")
    triton_ssl: bool = _opt("--triton-ssl", False, "Use TLS, for an address without a scheme")
    triton_root_cert: str = _opt("--triton-root-cert", "", "PEM file of the CA(s) that signed the server's certificate")
    triton_headers: str = _opt("--triton-headers", "", "Extra request headers, 'name=value,name=value' (secret: never "
                              "shown, logged or sent to workers; give each process its own)", secret=True)
    triton_timeout: float = _opt("--triton-timeout", 30.0, "Seconds before a request counts as timed out")
    workload: str = _opt("--workload", "sessions", "sessions (replay a prepared store), dumps (NVIDIA dump dir) "
                         "or timeline (natural replay of a store in the log's time order)")
    store: str = _opt("--store", "", "Prepared KuaiRand store (hstu-replay data prepare)")
    dump_dir: str = _opt("--dump-dir", "", "NVIDIA-format dump directory (hstu-replay server dump)")
    hit_ratios: str = _opt("--hit-ratios", "0,0.5,1.0", "Target KV-cache hit ratios, one stage each")
    batch_sizes: str = _opt("--batch-sizes", "1", "Users per request (1..8), one sweep each")
    arrival: str = _opt("--arrival", "closed", "closed (back to back), constant or poisson (open loop)")
    request_rate: float = _opt("--request-rate", 0.0, "Open loop: measured requests per second, all users together")
    time_scale: float = _opt("--time-scale", 0.0, "Timeline: replay the log this many times faster than recorded "
                             "(0: at --request-rate, or back to back)")
    time_slice_ms: int = _opt("--time-slice-ms", 0, "Timeline: visits in one slice of log time share a request "
                              "(up to the batch size; 0: one visit per request)")
    timeline_shard: str = _opt("--timeline-shard", "", "Timeline: replay only shard i of n of the users "
                               "('i/n': store index modulo n), as one of n servers would see them")
    stage_seconds: float = _opt("--stage-seconds", 10.0, "Measured seconds per stage")
    stage_requests: int = _opt("--stage-requests", 0,
                               "End a stage after this many measured requests (0: on --stage-seconds only, "
                               "which stays the upper bound; one process only)")
    warmup_seconds: float = _opt("--warmup-seconds", 2.0, "Seconds at the start of each stage left out")
    candidates: int = _opt("--candidates", 16, "Candidates ranked per user (session replay)")
    max_history: int = _opt("--max-history", 4096, "Longest history sent, in items")
    max_values: int = _opt("--max-values", 40000, "Largest request (len(values)) the model takes")
    cache_budget_tokens: int = _opt("--cache-budget-tokens", 0, "Server KV-cache capacity in tokens (0: unbounded)")
    cache_page_tokens: int = _opt("--cache-page-tokens", 32, "Server KV-cache page size in tokens")
    verify_fraction: float = _opt("--verify-fraction", 1.0, "Fraction of responses checked against references")
    tolerance: float = _opt("--tolerance", 0.0625, "Max absolute logit difference accepted")
    report_dir: str = _opt("--report-dir", "runs/latest", "Where records and reports are written")
    max_mismatches: int = _opt("--max-mismatches", -1, "Fail the run above this many mismatches (-1: off)")
    max_error_ratio: float = _opt("--max-error-ratio", -1.0, "Fail the run above this failure ratio (-1: off)")
    max_p99_ms: str = _opt("--max-p99-ms", "", "Fail if p99 exceeds: '250' or 'ratio:ms,...'")
    min_speedup: str = _opt("--min-speedup", "", "Fail if speed-up over 0% is below: 'ratio:x,...'")
    seed: int = _opt("--replay-seed", 0, "Seed of the user order")
    min_stage_requests: int = _opt("--min-stage-requests", 30, "A stage with fewer measured requests is flagged thin")
    max_loop_lag_ms: float = _opt("--max-loop-lag-ms", 50.0,
                                  "A stage whose client event loop ran later than this (p99) is flagged client-bound")

    # -- derived ----------------------------------------------------------------------

    @property
    def ratios(self) -> tuple[float, ...]:
        return _float_list(self.hit_ratios, "--hit-ratios")

    @property
    def batches(self) -> tuple[int, ...]:
        return tuple(int(x) for x in _float_list(self.batch_sizes, "--batch-sizes"))

    @property
    def shard(self) -> tuple[int, int]:
        """(i, n) of --timeline-shard; (0, 1): every user."""
        if not self.timeline_shard:
            return 0, 1
        i, sep, n = str(self.timeline_shard).partition("/")
        try:
            shard = int(i), int(n)
        except ValueError:
            shard = (-1, 0)
        if not sep or not 0 <= shard[0] < shard[1]:
            raise ConfigError(f"--timeline-shard {self.timeline_shard!r}: give i/n with 0 <= i < n, e.g. 0/2")
        return shard

    @property
    def limits(self) -> Limits:
        return Limits(max_history=self.max_history, max_values=self.max_values)

    def client_options(self) -> ClientOptions:
        return ClientOptions(
            url=self.triton_url, protocol=self.triton_protocol, model=self.triton_model, ssl=self.triton_ssl,
            root_certificates=self.triton_root_cert or None, headers=_headers(self.triton_headers),
            timeout_s=self.triton_timeout,
        )

    def validate(self) -> LoadTestConfig:
        if any(not 0.0 <= r <= 1.0 for r in self.ratios):
            raise ConfigError(f"--hit-ratios {self.hit_ratios!r}: every ratio must lie in 0..1")
        if any(not 1 <= b <= 8 for b in self.batches) or any(b != int(b) for b in _float_list(self.batch_sizes, "--batch-sizes")):
            raise ConfigError(f"--batch-sizes {self.batch_sizes!r}: whole numbers in 1..8")
        if self.workload not in ("sessions", "dumps", "timeline"):
            raise ConfigError(f"--workload {self.workload!r}: use sessions, dumps or timeline")
        if self.workload in ("sessions", "timeline") and not self.store:
            raise ConfigError(f"--workload {self.workload} needs --store (a prepared KuaiRand store)")
        if self.time_scale < 0 or self.time_slice_ms < 0:
            raise ConfigError(f"--time-scale {self.time_scale} / --time-slice-ms {self.time_slice_ms}: use 0 or more")
        if self.time_scale > 0 and self.workload != "timeline":
            raise ConfigError("--time-scale replays the log's own times: only with --workload timeline")
        if self.shard != (0, 1) and self.workload != "timeline":
            raise ConfigError("--timeline-shard splits a natural replay's users: only with --workload timeline")
        if self.time_scale > 0 and self.arrival != "closed":
            raise ConfigError("--time-scale sets the send times itself: leave --arrival closed")
        if self.workload == "dumps" and not self.dump_dir:
            raise ConfigError("--workload dumps needs --dump-dir")
        if self.arrival not in ARRIVALS:
            raise ConfigError(f"--arrival {self.arrival!r}: use one of {', '.join(ARRIVALS)}")
        if self.arrival != "closed" and self.request_rate <= 0:
            raise ConfigError(f"--arrival {self.arrival} needs --request-rate > 0")
        if self.stage_requests < 0:
            raise ConfigError(f"--stage-requests {self.stage_requests}: use 0 (off) or a count")
        if self.stage_seconds <= 0 or self.warmup_seconds < 0:
            raise ConfigError("--stage-seconds must be > 0 and --warmup-seconds >= 0")
        if not 0.0 <= self.verify_fraction <= 1.0:
            raise ConfigError(f"--verify-fraction {self.verify_fraction}: use 0..1")
        if not 1 <= self.candidates <= self.limits.max_candidates:
            raise ConfigError(f"--candidates {self.candidates}: use 1..{self.limits.max_candidates} "
                              "(the published model's limit)")
        if self.max_history < 1 or self.max_values < 1:
            raise ConfigError(f"--max-history {self.max_history} / --max-values {self.max_values}: at least 1")
        if self.min_stage_requests < 1 or self.max_loop_lag_ms <= 0:
            raise ConfigError("--min-stage-requests must be >= 1 and --max-loop-lag-ms > 0")
        self.client_options()  # checks protocol and url
        self.thresholds()  # a malformed threshold is found before the sweep, not after it
        return self

    def stage_rules(self):
        from hstu_replay.report.flags import StageRules

        return StageRules(self.min_stage_requests, self.cache_page_tokens, loop_lag_bound_ms=self.max_loop_lag_ms)

    def thresholds(self):
        from hstu_replay.report.thresholds import parse_thresholds

        return parse_thresholds(None if self.max_mismatches < 0 else self.max_mismatches,
                                None if self.max_error_ratio < 0 else self.max_error_ratio,
                                self.max_p99_ms, self.min_speedup)

    @property
    def address_url(self) -> str:
        """The Triton address as a URL (what Locust's Host field shows)."""
        scheme = {("grpc", False): "grpc", ("grpc", True): "grpcs", ("http", False): "http", ("http", True): "https"}
        return f"{scheme[self.triton_protocol, self.triton_ssl]}://{self.triton_url}"

    @classmethod
    def from_options(cls, parsed, host: str | None = None, secrets: dict | None = None) -> LoadTestConfig:
        """The config of Locust's parsed options; `host` is Locust's --host / Host field (the
        target address), `secrets` the values kept out of the options (see `take_secrets`)."""
        values = {}
        for f in fields(cls):
            raw = (secrets or {}).get(f.name, getattr(parsed, f.name, f.metadata["arg_default"]))
            try:
                values[f.name] = _coerce(raw, type(f.default))
            except (TypeError, ValueError):
                shown = "(secret)" if f.metadata["secret"] else repr(raw)
                raise ConfigError(f"{f.metadata['flag']} {shown}: expected a {type(f.default).__name__}") from None
        address = resolve_address(host, values["triton_url"], values["triton_protocol"], values["triton_ssl"])
        values["triton_url"], values["triton_protocol"], values["triton_ssl"] = address
        return cls(**values).validate()


SECRETS = tuple(f.name for f in fields(LoadTestConfig) if f.metadata["secret"])


def take_secrets(parsed) -> dict:
    """Move the secret options out of Locust's parsed options (which a master sends to every
    worker, and the web form could read or set) and return them. Each process reads its own
    from its command line or environment."""
    taken = {name: getattr(parsed, name, "") or "" for name in SECRETS}
    for name in SECRETS:
        setattr(parsed, name, "")
    return taken


def resolve_address(host: str | None, url: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    """(host:port, protocol, tls) from --host and its alias --triton-url: `grpc://h:p`,
    `grpcs://h:p`, `http://h:p`, `https://h:p` (the scheme sets protocol and TLS) or a bare
    `h:p` (then --triton-protocol and --triton-ssl). Both given and different: an error."""
    given = [_split_address(flag, text, protocol, ssl) for flag, text in (("--host", host), ("--triton-url", url))
             if text]
    if not given:
        return DEFAULT_ADDRESS, protocol, ssl
    if any(other != given[0] for other in given[1:]):
        raise ConfigError(f"--host {host!r} and --triton-url {url!r} name different targets: give one")
    return given[0]


def _split_address(flag: str, text: str, protocol: str, ssl: bool) -> tuple[str, str, bool]:
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    rest = rest.rstrip("/")
    if not sep:
        return text, protocol, ssl
    if scheme.lower() not in SCHEMES:
        raise ConfigError(f"{flag} {text!r}: use grpc://, grpcs://, http:// or https:// (or host:port)")
    named_protocol, named_ssl = SCHEMES[scheme.lower()]
    if protocol != "grpc" and protocol != named_protocol:
        raise ConfigError(f"{flag} {text!r} says {named_protocol}, --triton-protocol says {protocol}: give one")
    if ssl and not named_ssl:
        raise ConfigError(f"{flag} {text!r} has no TLS but --triton-ssl is set: use https:// or grpcs://")
    if not rest or "/" in rest:
        raise ConfigError(f"{flag} {text!r}: give scheme://host:port (no path)")
    return rest, named_protocol, named_ssl


def register_arguments(parser) -> None:
    """Add every option to Locust's parser, in groups. The web form shows all but the target
    address (the Host field) and secrets; what a submitted form may change is checked again
    there (loadtest.webform)."""
    for action in parser._actions:  # Locust's own --host is the Triton address here
        if action.dest == "host":
            action.metavar, action.help = "<triton url>", ("The Triton address: grpc://host:8001, http://host:8000, "
                                                           "https:// (HTTP + TLS) or grpcs:// (gRPC + TLS)")
    where = {name: title for title, names in GROUPS.items() for name in names}
    by_group = {title: [] for title in GROUPS}
    for f in fields(LoadTestConfig):
        by_group[where.get(f.name, DEFAULT_GROUP)].append(f)
    for title, members in by_group.items():
        group = parser.add_argument_group(f"hstu-replay: {title.lower()}")
        for f in members:
            env = "LOCUST_" + f.metadata["flag"][2:].upper().replace("-", "_")
            web = not f.metadata["secret"] and f.name not in ADDRESS_OPTIONS
            kwargs = {"default": f.metadata["arg_default"], "help": f"{title.split(' (')[0]}: {f.metadata['help']}",
                      "env_var": env}
            if isinstance(f.default, bool):
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = type(f.default)
            action = group.add_argument(f.metadata["flag"], dest=f.name, **kwargs)
            # what LocustArgumentParser.add_argument sets (an argument group's add_argument does not)
            action.include_in_web_ui, action.is_secret, action.is_required, action.is_multiple = web, False, False, False


def _coerce(raw, kind):
    if kind is bool:
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    return kind(raw)


def _float_list(text: str, flag: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: give comma-separated numbers") from None
    if not values:
        raise ConfigError(f"{flag} is empty")
    return values


def _headers(text: str) -> dict[str, str]:
    headers = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--triton-headers: item {len(headers) + 1} is not name=value (value not shown)")
        headers[name.strip()] = value.strip()
    return headers
