"""Command-line options, declared once (`Option` and the catalog of options that several commands
share), and numbers from their text, checked once: one line naming the option, the value and the rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from hstu_replay.cache_ledger import DEFAULT_OFFLOAD_CHUNK_TOKENS, DEFAULT_PAGE_TOKENS
from hstu_replay.errors import ConfigError
from hstu_replay.interface import DEFAULT_ADDRESS, PUBLISHED_LIMITS, Limits
from hstu_replay.verify import DEFAULT_TOLERANCE


def number(flag: str, text: str | None, low: float | None = None, high: float | None = None, *,
           above: bool = False, integral: bool = False) -> float:
    """`text` as a finite number >= `low` (> with `above`) and <= `high`; an int if `integral`."""
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{flag} {text!r}: expected a number") from None
    if not math.isfinite(value) or (integral and value != int(value)):
        raise ConfigError(f"{flag} {text!r}: expected a finite {'whole ' if integral else ''}number")
    if low is not None and (value <= low if above else value < low):
        raise ConfigError(f"{flag} {text!r}: must be {'>' if above else '>='} {low:g}")
    if high is not None and value > high:
        raise ConfigError(f"{flag} {text!r}: must be <= {high:g}")
    return int(value) if integral else value


def split_args(flag: str, text: str) -> tuple[str, ...]:
    """Arguments given as one option's text (`--serve-args`, `--locust-args`), split as a shell would."""
    import shlex

    try:
        return tuple(shlex.split(text))
    except ValueError as exc:
        raise ConfigError(f"{flag} {text!r}: {exc}") from None


def within(*checks: tuple[str, int, int, int | None]) -> None:
    """Each (flag, value, low, high) with low <= value (<= high); else one line naming the first that is not."""
    for name, value, low, high in checks:
        if value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise ConfigError(f"{name} must be {bounds}, got {value}")


def numbers(flag: str, text: str, low: float | None = None, high: float | None = None, *,
            above: bool = False, integral: bool = False, blanks: bool = False, count: int | None = None,
            digits: bool = False, form: str = "comma-separated numbers") -> tuple[float, ...]:
    """Comma-separated `number`s, each checked alike: the one list parser of every option.

    A blank item (or an empty text) is refused, unless `blanks`: then blank items are left out and
    an empty text is an empty tuple. `count`: exactly that many items. `digits`: each item written
    as a whole number in digits (no 1e6, no 3.0). `form` is what such a refusal asks for."""
    return tuple(number(flag, p, low, high, above=above, integral=integral)
                 for p in list_items(flag, text, blanks=blanks, count=count, digits=digits, form=form))


def list_items(flag: str, text: str, *, blanks: bool = False, count: int | None = None, digits: bool = False,
               form: str = "comma-separated numbers") -> list[str]:
    """The comma-separated items of an option's text, stripped (`numbers` says what the keywords do)."""
    parts = [p.strip() for p in str(text).split(",")]
    if blanks:
        parts = [p for p in parts if p]
    if ((not blanks and not all(parts)) or (count is not None and len(parts) != count)
            or (digits and not all(p.removeprefix("-").isdigit() for p in parts))):
        raise ConfigError(f"{flag} {text!r}: give {form}")
    return parts


def batch_number(flag: str, given: str | int, limits: Limits = PUBLISHED_LIMITS) -> int:
    """A batch size (users per request) from an option: a whole number the model takes
    (`Limits.takes_batch`); else one line naming the option, the value and the range."""
    text = str(given).strip()
    value = _float_or_nan(text)
    if not (value.is_integer() and limits.takes_batch(int(value))):
        raise ConfigError(f"{flag} {text!r}: use a whole number of users in {limits.batch_range}")
    return int(value)


def batch_numbers(flag: str, text: str, limits: Limits = PUBLISHED_LIMITS, *, blanks: bool = False) -> tuple[int, ...]:
    """Comma-separated batch sizes, each a `batch_number`."""
    return tuple(batch_number(flag, p, limits) for p in list_items(flag, text, blanks=blanks))


#: a KV-cache hit ratio lies in 0..1: the share of a request's history tokens the cache holds
HIT_RATIO_RANGE = (0.0, 1.0)
#: what a refusal of a hit ratio asks for
HIT_RATIO_RULE = f"use a hit ratio in {HIT_RATIO_RANGE[0]:g}..{HIT_RATIO_RANGE[1]:g}"


def is_hit_ratio(value: float) -> bool:
    """Whether `value` lies in `HIT_RATIO_RANGE` (NaN does not): the one hit-ratio check."""
    low, high = HIT_RATIO_RANGE
    return low <= value <= high


def hit_ratio_number(flag: str, given: str | float) -> float:
    """A target KV-cache hit ratio from an option (`is_hit_ratio`); else one line naming the
    option, the value and the range."""
    text = str(given).strip()
    value = _float_or_nan(text)
    if not is_hit_ratio(value):
        raise ConfigError(f"{flag} {text!r}: {HIT_RATIO_RULE}")
    return value


def hit_ratio_numbers(flag: str, text: str, *, blanks: bool = False) -> tuple[float, ...]:
    """Comma-separated hit ratios, each a `hit_ratio_number`."""
    return tuple(hit_ratio_number(flag, p) for p in list_items(flag, text, blanks=blanks))


def _float_or_nan(text: str) -> float:
    """The number `text` writes; NaN (which no range holds) where it writes none."""
    try:
        return float(text)
    except ValueError:
        return math.nan


# -- declaring options ------------------------------------------------------------------------

_GIVEN = object()  # "no override": the option's own default or help
#: what Locust's parser takes beside argparse's keywords; set on the action for parsers and groups that do not
LOCUST_KEYWORDS = ("include_in_web_ui", "is_secret", "is_required", "is_multiple")


@dataclass(frozen=True)
class Option:
    """One command-line option, declared once: its flag, meaning (help), default and type.

    `add_to` registers it on an argparse parser or argument group, or on Locust's (configargparse)
    parser. A command that checks its options itself, one line per refusal (`number`, `numbers`),
    registers it `text=True`: argparse then keeps the text, and the default is the default's text.
    A flag without a leading dash is a positional argument; `type=bool` is a switch (store_true).
    """

    flag: str
    help: str
    default: Any = None
    type: type | None = None  # int, float, bool (a switch) or None: text
    metavar: str | None = None
    dest: str | None = None
    choices: tuple[str, ...] | None = None

    @property
    def name(self) -> str:
        """The attribute argparse stores it under."""
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    def but(self, **changes: Any) -> Option:
        """The same option with some fields changed (another flag for one meaning, say)."""
        return replace(self, **changes)

    def add_to(self, parser: Any, *, default: Any = _GIVEN, help: str | None = None, text: bool = False,
               name_default: bool = True, **extra: Any):
        """Add to `parser` and return the action; `default`/`help` replace the option's own for one
        command, `extra` goes to `add_argument` (required, env_var, ...; Locust's include_in_web_ui
        and is_secret too: the Locust arguments of `loadtest.options` come this way). With
        `name_default` the help names the default (argparse expands it; Locust's web form shows the
        help as written, so its arguments leave it out)."""
        default = self.default if default is _GIVEN else default
        locust = {k: extra.pop(k) for k in LOCUST_KEYWORDS if k in extra}
        help = self.help if help is None else help
        kwargs: dict[str, Any] = {"help": _with_default(help, default) if name_default else help}
        if self.type is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["default"] = str(default) if text and default is not None else default
            if self.type is not None and not text:
                kwargs["type"] = self.type
            if self.metavar is not None:
                kwargs["metavar"] = self.metavar
            if self.choices is not None:
                kwargs["choices"] = self.choices
        if self.flag.startswith("-"):
            kwargs["dest"] = self.name
        else:  # a positional argument: its name is its dest, and it is always given
            kwargs.pop("default", None)
        action = parser.add_argument(self.flag, **{**kwargs, **extra})
        for key, value in locust.items():
            setattr(action, key, value)
        return action


def _with_default(text: str, default: Any) -> str:
    """The help, naming the default where there is one worth naming and the help does not already."""
    if default is None or default is False or default == "" or "default" in text:
        return text
    return f"{text} (default %(default)s)"


# -- the options several commands share: one declaration, one default per meaning ------------
# Where two options share a flag but not a meaning, each has its own entry and its name says which.

# the Triton address and model
TRITON_URL = Option("--triton-url", "Triton host:port", DEFAULT_ADDRESS)
TRITON_PROTOCOL = Option("--triton-protocol", "grpc or http", "grpc")
TRITON_MODEL = Option("--triton-model", "model", "hstu_gr_ranking_kvcache")

# the data replayed
WORKLOAD = Option("--workload", "sessions (--store) or dumps (--dump-dir)", "sessions")
STORE = Option("--store", "prepared KuaiRand store", metavar="STORE")
DUMP_DIR = Option("--dump-dir", "NVIDIA-format dump directory", metavar="DIR")
CANDIDATES = Option("--candidates", "candidates ranked per user", 16, int)
#: the published model's limit, what the load test sends by default
MAX_HISTORY = Option("--max-history", "longest history in items", PUBLISHED_LIMITS.max_history, int)
#: the small CPU model's limit (`--config small`, the built-in server's default)
SMALL_MAX_HISTORY = MAX_HISTORY.but(help="longest history in items (default %(default)s: the small model's limit)",
                                    default=256)
#: what a model is built and dumped with: its config's maximum unless given
MODEL_MAX_HISTORY = MAX_HISTORY.but(help="longest history in items (default: the model's maximum)", default=None)
MAX_VALUES = Option("--max-values", "largest len(values) the model takes", PUBLISHED_LIMITS.max_values, int)
REPLAY_SEED = Option("--replay-seed", "seed of the user order", 0, int, dest="seed")
#: natural replay: a visit whose history is past the limit (plan.over_limit)
OVER_LIMIT = Option("--over-limit", "natural replay, a visit whose history is past the limit: skip (not sent, as "
                    "NVIDIA's KV-cache replay does), oldest (the first items again: a frozen visit) or rebase "
                    "(the latest items on a fresh cache key)", "skip")
REBASE_KEEP = Option("--rebase-keep", "--over-limit rebase: the fraction of the limit a rebased history keeps "
                     "(the latest items), in (0, 1]", 0.5, float)

# the requests
HIT_RATIOS = Option("--hit-ratios", "target KV-cache hit ratios, one stage (or search) each", "0,0.5,1.0")
BATCH_RANGE = PUBLISHED_LIMITS.batch_range
BATCH_SIZE = Option("--batch-size", f"users per request, {BATCH_RANGE}", 1, int)
#: natural replay: requests group the visits of one time slice, up to this many
VISITS_PER_REQUEST = BATCH_SIZE.but(help=f"most visits per request, {BATCH_RANGE}")
#: the load test's sweep
BATCH_SIZES = Option("--batch-sizes", f"users per request ({BATCH_RANGE}), one sweep each", "1")
#: the published protocol's batch-size scaling table
SCALING_BATCH_SIZES = BATCH_SIZES.but(help="batch sizes of the scaling table", default="1,2,4,8")
TIME_SLICE_MS = Option("--time-slice-ms", "visits of one slice of log time share a request (0: one visit each)", 0,
                       int)
REQUEST_RATE = Option("--request-rate", "offered requests per second, all users together", type=float)
WARMUP_SECONDS = Option("--warmup-seconds", "warm-up seconds before each measured window", 2.0, float)

# the server's KV cache and the answers
PAGE_TOKENS = Option("--page-tokens", "KV-cache page size in tokens", DEFAULT_PAGE_TOKENS, int)
#: the server's host tier and the client's model of it: one chunk size for both
OFFLOAD_CHUNK_TOKENS = Option("--offload-chunk-tokens", "--offload-mode native: the host tier's chunk in tokens "
                              "(NVIDIA's offload_chunksize)", DEFAULT_OFFLOAD_CHUNK_TOKENS, int)
BUDGETS = Option("--budgets", "KV-cache budgets in tokens, comma-separated", metavar="TOKENS,...")
TOLERANCE = Option("--tolerance", "max absolute logit difference accepted", DEFAULT_TOLERANCE, float)

# capacity's service-level objective
SLO_P99_MS = Option("--slo-p99-ms", "SLO: p99 latency in ms", type=float)
SLO_ERROR_RATIO = Option("--slo-error-ratio", "SLO: largest failure ratio", 0.01, float)

# the reference server's model, built, served and dumped
REPOSITORY = Option("--repository", "Triton model repository", "runs/model_repository")
MODEL_CONFIG = Option("--config", "model config: small, kuairand-1k, kuairand-1k-8l", "small")
WEIGHTS_SEED = Option("--seed", "weights seed", 0, int)
DEVICE = Option("--device", "cpu, cuda or auto", "auto")
SERVE_ARGS = Option("--serve-args", 'more `server serve` arguments, e.g. --serve-args="--threads 1"', "")
THREADS = Option("--threads", "CPU threads of the model (0: OMP_NUM_THREADS if set, else the usable cores minus one: "
                 "beside other work a model on every core slows down several-fold)", 0, int)
DUMP_BATCHES = Option("--batches", "dump batches: batch 0 is the warm-up, the rest measured", 16, int)
DUMP_BATCH_SIZE = Option("--batch-size", "users per dump batch", 4, int)
DUMP_SEED = Option("--dump-seed", "seed of the users drawn into the dump", 0, int)
