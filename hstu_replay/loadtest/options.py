"""Every load-test option, declared once in `OPTIONS`: its flag, default, help, group and secrecy.

Locust shows them in the web UI and reads them from the command line, `locust.conf` and
`LOCUST_<NAME>` environment variables. `option_values` reads them once, typed, into a flat dict
(what report.json shows under "options"); `loadtest.config` turns that into the run's typed,
validated config sections.
"""

from __future__ import annotations

from dataclasses import dataclass

from hstu_replay import arguments as A
from hstu_replay.arguments import Option
from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.address import DEFAULT_ADDRESS

DEFAULT_GROUP = "Sweep and load"


@dataclass(frozen=True)
class LoadOption:
    """An option of the catalog (`hstu_replay.arguments`: flag, meaning, default, type) placed in the
    load test: its web-form group, its wording here, whether it is secret."""

    option: Option
    group: str = DEFAULT_GROUP
    secret: bool = False  # never shown, logged, sent to workers nor taken from a form
    unset: object = None  # the command line's default where it differs from `default` (unset)

    @property
    def dest(self) -> str:
        return self.option.name

    @property
    def flag(self) -> str:
        return self.option.flag

    @property
    def default(self):  # its type is the option's type
        return self.option.default

    @property
    def help(self) -> str:
        return self.option.help

    @property
    def arg_default(self):
        return self.default if self.unset is None else self.unset

    @property
    def env_var(self) -> str:
        return "LOCUST_" + self.flag[2:].upper().replace("-", "_")


def _own(flag: str, default: object, help: str) -> Option:
    """An option of the load test alone (the catalog holds those several commands share)."""
    return Option(flag, help, default, type(default))


DATA, NATURAL, CACHE, CHECKS = ("Data", "Natural replay (--workload timeline)", "Server cache", "Checks and report")
TARGET = "Target (the address is the Host field)"

#: Option groups, in the order the web form lists them (each help text starts with its group).
GROUPS = (DATA, NATURAL, DEFAULT_GROUP, CACHE, CHECKS, TARGET)

#: Every option, in the order report.json's "options" lists them.
OPTIONS: tuple[LoadOption, ...] = (
    LoadOption(A.TRITON_URL.but(default=DEFAULT_ADDRESS, help="Alias of --host: the Triton address, grpc://host:8001, "
               "http://host:8000, https:// or grpcs:// for TLS, or host:port"), TARGET, unset=""),
    LoadOption(A.TRITON_PROTOCOL.but(help="grpc or http, for an address without a scheme"), TARGET),
    LoadOption(A.TRITON_MODEL.but(help="Model name; its interface is detected"), TARGET),
    LoadOption(_own("--triton-grpc-transport", "h2", "gRPC inference requests through h2 (HTTP/2 on the event loop's "
                    "own sockets, lighter) or grpcio"), TARGET),
    LoadOption(_own("--triton-ssl", False, "Use TLS, for an address without a scheme"), TARGET),
    LoadOption(_own("--triton-root-cert", "", "PEM file of the CA(s) that signed the server's certificate"), TARGET),
    LoadOption(_own("--triton-headers", "", "Extra request headers, 'name=value,name=value' (secret: never shown, "
                    "logged or sent to workers; give each process its own)"), TARGET, secret=True),
    LoadOption(_own("--triton-timeout", 30.0, "Seconds before a request counts as timed out"), TARGET),
    LoadOption(A.WORKLOAD.but(help="sessions (replay a prepared store), dumps (NVIDIA dump dir) or timeline (natural "
                              "replay of a store in the log's time order)"), DATA),
    LoadOption(A.STORE.but(default="", help="Prepared KuaiRand store (hstu-replay data prepare)"), DATA),
    LoadOption(A.DUMP_DIR.but(default="", help="NVIDIA-format dump directory (hstu-replay server dump)"), DATA),
    LoadOption(A.HIT_RATIOS.but(help="Target KV-cache hit ratios, one stage each")),
    LoadOption(A.BATCH_SIZES.but(help="Users per request (1..8), one sweep each")),
    LoadOption(_own("--arrival", "closed", "closed (back to back), constant or poisson (open loop)")),
    LoadOption(A.REQUEST_RATE.but(default=0.0, help="Open loop: measured requests per second, all users together")),
    LoadOption(_own("--time-scale", 0.0, "Timeline: replay the log this many times faster than recorded "
                    "(0: at --request-rate, or back to back)"), NATURAL),
    LoadOption(A.TIME_SLICE_MS.but(help="Timeline: visits in one slice of log time share a request (up to the batch "
                                   "size; 0: one visit per request)"), NATURAL),
    LoadOption(_own("--timeline-shard", "", "Timeline: replay only shard i of n of the users ('i/n': store index "
                    "modulo n), as one of n servers would see them"), NATURAL),
    *(LoadOption(o.but(help="Timeline: " + o.help), NATURAL) for o in (A.OVER_LIMIT, A.REBASE_KEEP)),
    LoadOption(_own("--stage-seconds", 10.0, "Measured seconds per stage")),
    LoadOption(_own("--stage-requests", 0, "End a stage after this many measured requests (0: on --stage-seconds "
                    "only, which stays the upper bound; one process only)")),
    LoadOption(A.WARMUP_SECONDS.but(help="Seconds at the start of each stage left out")),
    LoadOption(A.CANDIDATES.but(help="Candidates ranked per user (session replay)"), DATA),
    LoadOption(A.MAX_HISTORY.but(help="Longest history sent, in items"), DATA),
    LoadOption(A.MAX_VALUES.but(help="Largest request (len(values)) the model takes"), DATA),
    LoadOption(_own("--cache-budget-tokens", 0, "Server KV-cache capacity in tokens (0: unbounded)"), CACHE),
    LoadOption(A.PAGE_TOKENS.but(flag="--cache-page-tokens", help="Server KV-cache page size in tokens"), CACHE),
    LoadOption(_own("--host-budget-tokens", 0, "Server host-tier KV capacity in tokens behind the GPU pool of "
                    "--cache-budget-tokens (0: no host tier)"), CACHE),
    LoadOption(_own("--offload-mode", "native", "How the server fills its host tier: native (whole chunks of "
                    "--offload-chunk-tokens, the reference target's default) or flexkv (every user after each "
                    "forward)"), CACHE),
    LoadOption(A.OFFLOAD_CHUNK_TOKENS.but(help="The server's chunk under --offload-mode native (its "
                                          "--offload-chunk-tokens; NVIDIA's offload_chunksize)"), CACHE),
    LoadOption(_own("--tier-mix", "", "Sessions: steer users to cache tiers at each stage's hit ratio, e.g. "
                    "gpu:0.6,host:0.3,miss:0.1 (empty: off)"), CACHE),
    LoadOption(_own("--working-set", 0, "Sessions: each virtual user revisits N keys round-robin at a fixed history "
                    "length, with --hit-ratios 1 (0: off; see \"Working-set sweep\")"), CACHE),
    LoadOption(_own("--verify-fraction", 1.0, "Fraction of responses checked against references"), CHECKS),
    LoadOption(A.TOLERANCE.but(help="Max absolute logit difference accepted"), CHECKS),
    LoadOption(_own("--report-dir", "runs/latest", "Where records and reports are written"), CHECKS),
    LoadOption(_own("--max-mismatches", -1, "Fail the run above this many mismatches (-1: off)"), CHECKS),
    LoadOption(_own("--max-error-ratio", -1.0, "Fail the run above this failure ratio (-1: off)"), CHECKS),
    LoadOption(_own("--max-p99-ms", "", "Fail if p99 exceeds: '250' or 'ratio:ms,...'"), CHECKS),
    LoadOption(_own("--min-speedup", "", "Fail if speed-up over 0% is below: 'ratio:x,...'"), CHECKS),
    LoadOption(_own("--max-workers-lost", -1, "Fail a distributed run that loses more workers than this (-1: off; "
                    "any threshold set also fails the stages a lost worker flagged)"), CHECKS),
    LoadOption(_own("--master-timeout", 5.0, "A worker whose master is silent this many seconds stops its users "
                    "and exits (set it on the master: workers take its value with each run)"), CHECKS),
    LoadOption(A.REPLAY_SEED.but(help="Seed of the user order"), DATA),
    LoadOption(_own("--min-stage-requests", 30, "A stage with fewer measured requests is flagged thin"), CHECKS),
    LoadOption(_own("--max-loop-lag-ms", 50.0, "A stage whose client event loop ran later than this (p99) is flagged "
                    "client-bound"), CHECKS),
)
BY_DEST = {o.dest: o for o in OPTIONS}

# What the web form may change. Paths only below --web-paths-root, the target address only with
# --web-edit-target, secrets never (they are not sent to the page nor taken from a form).
PATH_OPTIONS = ("triton_root_cert", "store", "dump_dir", "report_dir")
ADDRESS_OPTIONS = ("triton_url", "triton_protocol", "triton_ssl")
SECRETS = tuple(o.dest for o in OPTIONS if o.secret)


def take_secrets(parsed) -> dict:
    """Move the secret options out of Locust's parsed options (which a master sends to every
    worker, and the web form could read or set) and return them. Each process reads its own
    from its command line or environment."""
    taken = {name: getattr(parsed, name, "") or "" for name in SECRETS}
    for name in SECRETS:
        setattr(parsed, name, "")
    return taken


def option_values(parsed, secrets: dict | None = None) -> dict:
    """Every option of Locust's parsed options, typed (an option missing there: its unset
    default); `secrets` are the values kept out of the options (see `take_secrets`)."""
    values = {}
    for o in OPTIONS:
        raw = (secrets or {}).get(o.dest, getattr(parsed, o.dest, o.arg_default))
        try:
            values[o.dest] = _coerce(raw, type(o.default))
        except (TypeError, ValueError):
            shown = "(secret)" if o.secret else repr(raw)
            raise ConfigError(f"{o.flag} {shown}: expected a {type(o.default).__name__}") from None
    return values


def register_arguments(parser) -> None:
    """Add every option to Locust's parser, in groups. The web form shows all but the target
    address (the Host field) and secrets; what a submitted form may change is checked again
    there (loadtest.webform)."""
    for action in parser._actions:  # Locust's own --host is the Triton address here
        if action.dest == "host":
            action.metavar, action.help = "<triton url>", ("The Triton address: grpc://host:8001, http://host:8000, "
                                                           "https:// (HTTP + TLS) or grpcs:// (gRPC + TLS)")
    for title in GROUPS:
        group = parser.add_argument_group(f"hstu-replay: {title.lower()}")
        for o in (o for o in OPTIONS if o.group == title):
            kwargs = {"default": o.arg_default, "help": f"{title.split(' (')[0]}: {o.help}", "env_var": o.env_var}
            if isinstance(o.default, bool):
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = type(o.default)
            action = group.add_argument(o.flag, dest=o.dest, **kwargs)
            # what LocustArgumentParser.add_argument sets (an argument group's add_argument does not)
            web = not o.secret and o.dest not in ADDRESS_OPTIONS
            action.include_in_web_ui, action.is_secret, action.is_required, action.is_multiple = web, False, False, False


def _coerce(raw, kind):
    if kind is bool:
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    return kind(raw)
