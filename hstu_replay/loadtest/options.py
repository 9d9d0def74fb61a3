"""Every option hstu-replay registers on Locust's parser, declared once: its flag, default, help,
group and how the web form treats it; and the one path from such a declaration to a Locust
argument (`LoadOption.add_to`, `register_arguments`).

Locust reads them from the command line, `locust.conf` and `LOCUST_<FLAG>` environment variables
(one naming rule: `LoadOption.env_var`) and shows the form's fields in the web UI.
`option_values` reads the load test's (`OPTIONS`) once, typed, into a flat dict (what report.json
shows under "options"); `loadtest.config` turns that into the run's typed, validated config
sections. The web UI's own (`WEB_OPTIONS`) are read by `loadtest.webform` and `loadtest.webaccess`;
Locust's options read differently here (`LOCUST_OWN`: --host is the Triton address, loopback
bind hosts) are changed in the same registration. `hstu-replay options` lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hstu_replay import arguments as A
from hstu_replay.arguments import Option
from hstu_replay.errors import ConfigError
from hstu_replay.interface import DEFAULT_ADDRESS
from hstu_replay.loadtest.address import address_url
from hstu_replay.plan.reuse import PartialHits

DEFAULT_GROUP = "Sweep and load"


def env_var(flag: str) -> str:
    """The environment variable Locust reads an option from, the one naming rule: LOCUST_ and the
    flag in capitals, dashes as underscores (Locust's own options follow it too)."""
    return "LOCUST_" + flag.lstrip("-").upper().replace("-", "_")


class WebForm(Enum):
    """How Locust's web form treats an option (its value is the listing's word for it)."""

    FIELD = "form"  # a field of the form
    HOST = "Host field"  # part of the target address: the form's Host field sets it (with --web-edit-target)
    PATH = "form in root"  # a path: a field only with --web-paths-root, below it (loadtest.webform)
    HIDDEN = ""  # the command line, locust.conf and the environment only
    SECRET = "secret"  # never shown, logged, sent to workers nor taken from a form


@dataclass(frozen=True)
class LoadOption:
    """An option of the catalog (`hstu_replay.arguments`: flag, meaning, default, type) as a Locust
    argument: its group, how the web form treats it, its environment variable."""

    option: Option
    group: str = DEFAULT_GROUP
    form: WebForm = WebForm.FIELD
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
    def secret(self) -> bool:
        return self.form is WebForm.SECRET

    @property
    def arg_default(self):
        return self.default if self.unset is None else self.unset

    @property
    def env_var(self) -> str:
        return env_var(self.flag)

    def add_to(self, group):
        """Register on Locust's parser (or one of its argument groups) and return the action. Path
        options start hidden: `webform.show_paths` shows them where the form may change them."""
        return self.option.add_to(
            group, default=self.arg_default, help=f"{self.group.split(' (')[0]}: {self.help}", env_var=self.env_var,
            include_in_web_ui=self.form is WebForm.FIELD, is_secret=self.secret, is_required=False,
            is_multiple=False, name_default=False)


def _own(flag: str, default: object, help: str) -> Option:
    """An option of the load test alone (the catalog holds those several commands share)."""
    return Option(flag, help, default, type(default))


DATA, NATURAL, CACHE, CHECKS = ("Data", "Natural replay (--workload timeline)", "Server cache", "Checks and report")
TARGET = "Target (the address is the Host field)"
WEB_FORM, WEB_ACCESS = "Web form", "Web UI access"

#: Option groups, in the order they are registered and listed (each help text starts with its group).
GROUPS = (DATA, NATURAL, DEFAULT_GROUP, CACHE, CHECKS, TARGET, WEB_FORM, WEB_ACCESS)

#: Every option, in the order report.json's "options" lists them.
OPTIONS: tuple[LoadOption, ...] = (
    LoadOption(A.TRITON_URL.but(help="Alias of --host: the Triton address, grpc://host:8001, "
               "http://host:8000, https:// or grpcs:// for TLS, or host:port"), TARGET, WebForm.HOST, unset=""),
    LoadOption(A.TRITON_PROTOCOL.but(help="grpc or http, for an address without a scheme"), TARGET, WebForm.HOST),
    LoadOption(A.TRITON_MODEL.but(help="Model name; its interface is detected"), TARGET),
    LoadOption(_own("--triton-grpc-transport", "h2", "gRPC inference requests through h2 (HTTP/2 on the event loop's "
                    "own sockets, lighter) or grpcio"), TARGET),
    LoadOption(_own("--triton-ssl", False, "Use TLS, for an address without a scheme"), TARGET, WebForm.HOST),
    LoadOption(_own("--triton-root-cert", "", "PEM file of the CA(s) that signed the server's certificate"), TARGET,
               WebForm.PATH),
    LoadOption(_own("--triton-headers", "", "Extra request headers, 'name=value,name=value' (secret: never shown, "
                    "logged or sent to workers; give each process its own)"), TARGET, WebForm.SECRET),
    LoadOption(_own("--triton-timeout", 30.0, "Seconds before a request counts as timed out"), TARGET),
    LoadOption(_own("--routing", "key-hash", "A fleet (several addresses): key-hash (each virtual user's keys to "
                    "one server by a consistent hash), round-robin or random (what a plain balancer does)"), TARGET),
    LoadOption(_own("--routing-header", "", "Send each request's route key in this header, for a gateway to "
                    "hash on (empty: none)"), TARGET),
    LoadOption(_own("--fleet-metrics", "", "Behind a gateway (one --host): each server's KV-cache metrics URL "
                    "(server serve --cache-metrics-port), comma-separated; the report's per-server figures come "
                    "from them"), TARGET, WebForm.HIDDEN),
    LoadOption(A.WORKLOAD.but(help="sessions (replay a prepared store), dumps (NVIDIA dump dir) or timeline (natural "
                              "replay of a store in the log's time order)"), DATA),
    LoadOption(A.STORE.but(default="", help="Prepared KuaiRand store (hstu-replay data prepare)"), DATA, WebForm.PATH),
    LoadOption(A.DUMP_DIR.but(default="", help="NVIDIA-format dump directory (hstu-replay server dump)"), DATA,
               WebForm.PATH),
    LoadOption(_own("--partial-hits", PartialHits.PRIME.value, "Dumps, at hit ratios between 0 and 1: prime (each "
                    "request on a fresh key primed with the prefix that reaches the ratio, a priming request the "
                    "server computes too) or reuse (no primes: full hits on keys the same dumped user filled, and "
                    "cold requests, mixed to the ratio in tokens)"), DATA),
    LoadOption(A.HIT_RATIOS.but(help="Target KV-cache hit ratios, one stage each")),
    LoadOption(A.BATCH_SIZES.but(help=f"Users per request ({A.BATCH_RANGE}), one sweep each")),
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
    LoadOption(_own("--fleet-budgets", "", "Each server's KV-cache capacity in tokens, in the order of --host "
                    "(empty: --cache-budget-tokens for every server, or each server's control model)"), CACHE),
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
    LoadOption(_own("--report-dir", "runs/latest", "Where records and reports are written"), CHECKS, WebForm.PATH),
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
PATH_OPTIONS = tuple(o.dest for o in OPTIONS if o.form is WebForm.PATH)
ADDRESS_OPTIONS = tuple(o.dest for o in OPTIONS if o.form is WebForm.HOST)
#: the load test's secrets (the web password is the login's: loadtest.webaccess)
SECRETS = tuple(o.dest for o in OPTIONS if o.secret)

#: The web UI's own options (loadtest.webform, loadtest.webaccess): never in report.json's options.
WEB_PATHS_ROOT = LoadOption(Option(
    "--web-paths-root", f"Let the web form change path options ({', '.join(BY_DEST[d].flag for d in PATH_OPTIONS)}), "
    "only to paths below this directory", "", dest="hstu_web_paths_root"), WEB_FORM, WebForm.HIDDEN)
WEB_EDIT_TARGET = LoadOption(Option(
    "--web-edit-target", "Let the web form's Host field change the Triton address (off: the address of the command "
    "line)", False, bool, dest="hstu_web_edit_target"), WEB_FORM, WebForm.HIDDEN)
WEB_USER = LoadOption(Option("--web-user", "User name the web UI's login asks for (with --web-login)", "locust",
                             dest="hstu_web_user"), WEB_ACCESS, WebForm.HIDDEN)
WEB_PASSWORD = LoadOption(Option(
    "--web-password", f"Password the web UI's login asks for (with --web-login; secret, best given as "
    f"{env_var('--web-password')})", "", dest="hstu_web_password"), WEB_ACCESS, WebForm.SECRET)
WEB_OPTIONS = (WEB_PATHS_ROOT, WEB_EDIT_TARGET, WEB_USER, WEB_PASSWORD)

#: Every option registered on Locust's parser (`hstu-replay options` lists them, and `LOCUST_OWN`).
REGISTERED: tuple[LoadOption, ...] = OPTIONS + WEB_OPTIONS


@dataclass(frozen=True)
class LocustOwn:
    """One of Locust's own options, read differently here: its help, and its default where this
    changes it; listed in one of our groups."""

    flag: str
    dest: str
    group: str
    help: str
    default: object = None  # None: Locust's own
    unset: str = ""  # what leaving it unset means, where no default says it
    metavar: str | None = None
    form: WebForm = WebForm.HIDDEN

    @property
    def env_var(self) -> str:
        return env_var(self.flag)

    def apply(self, parser) -> None:
        (action,) = (a for a in parser._actions if a.dest == self.dest)
        action.help = self.help
        if self.metavar is not None:
            action.metavar = self.metavar
        if self.default is not None:
            parser.set_defaults(**{self.dest: self.default})


LOOPBACK = "127.0.0.1"
_BIND = "this machine only by default; '*' or 0.0.0.0 for every interface"
LOCUST_OWN = (
    LocustOwn("--host", "host", TARGET, "The Triton address: grpc://host:8001, http://host:8000, https:// (HTTP + "
              "TLS), grpcs:// (gRPC + TLS); the web form's Host field", unset=address_url(
                  DEFAULT_ADDRESS, BY_DEST["triton_protocol"].default, BY_DEST["triton_ssl"].default),
              metavar="<triton url>", form=WebForm.HOST),
    LocustOwn("--web-host", "web_host", WEB_ACCESS, f"Interface the web UI binds to: {_BIND} (then use --web-login)",
              LOOPBACK),
    LocustOwn("--master-bind-host", "master_bind_host", WEB_ACCESS, f"Interface a master binds to: {_BIND} (the "
              "master's port has no login: open it to the workers' network only)", LOOPBACK),
)


def register_arguments(parser) -> None:
    """The one registration on Locust's parser: Locust's own options as read here, then every
    option of `REGISTERED` through `LoadOption.add_to`, group by group. What a submitted form may
    change is checked again when it is submitted (loadtest.webform)."""
    for own in LOCUST_OWN:
        own.apply(parser)
    for title in GROUPS:
        group = parser.add_argument_group(f"hstu-replay: {title.lower()}")
        for o in REGISTERED:
            if o.group == title:
                o.add_to(group)


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


def _coerce(raw, kind):
    if kind is bool:
        return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
    return kind(raw)
