"""A run's request limits against the ones the server publishes, settled before the first request.

An option left at its default (--max-history, --max-values) that the server's model does not take
is capped to the server's limit (said on the terminal and in the report's run section); an option
set beyond it, or batch sizes or candidates beyond the server's, are refused in one line (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hstu_replay.arguments import MAX_HISTORY, MAX_VALUES
from hstu_replay.errors import ConfigError
from hstu_replay.interface import LIMIT_PARAMETERS, Limits
from hstu_replay.loadtest.config import LoadTestConfig


@dataclass(frozen=True)
class Cap:
    """An option left at its default, capped to the server's limit."""

    option: str  # "--max-history"
    asked: int  # the default
    used: int  # the server's limit

    def as_dict(self) -> dict:
        return {"option": self.option, "asked": self.asked, "used": self.used}


@dataclass(frozen=True)
class CappedOption:
    """An option that a server's limit caps when left at its default."""

    option: str
    field: str  # of DataConfig and of Limits (and the option's name in the config's options)
    default: int
    unit: str


CAPPED = (CappedOption(MAX_HISTORY.flag, "max_history", MAX_HISTORY.default, "history items"),
          CappedOption(MAX_VALUES.flag, "max_values", MAX_VALUES.default, "values per request"))


def fit_to_server(config: LoadTestConfig, limits: Limits | None) -> tuple[LoadTestConfig, tuple[Cap, ...]]:
    """The config within the server's published `limits` (unchanged where it publishes none), and
    the caps applied; a ConfigError naming the option, the value, the server's limit and the fix
    where an option given goes beyond them."""
    if limits is None:
        return config, ()
    most = max(config.sweep.batches)
    if not limits.takes_batch(most):  # the sweep's sizes are whole and at least 1: the largest decides
        raise ConfigError(f"--batch-sizes {config.options['batch_sizes']}: the server's model takes at most "
                          f"{limits.max_batch} users per request ({_published('max_batch')}); give batch sizes "
                          f"of {limits.max_batch} or less")
    if config.data.candidates > limits.max_candidates:
        raise ConfigError(f"--candidates {config.data.candidates}: the server's model takes at most "
                          f"{limits.max_candidates} candidates per user ({_published('max_candidates')}); give "
                          f"--candidates {limits.max_candidates} or less")
    caps, changes = [], {}
    for capped in CAPPED:
        asked, limit = getattr(config.data, capped.field), getattr(limits, capped.field)
        if asked <= limit:
            continue
        if asked != capped.default:
            raise ConfigError(f"{capped.option} {asked}: the server's model takes at most {limit:,} {capped.unit} "
                              f"({_published(capped.field)}); give {capped.option} {limit} or less, or leave it "
                              "out to take the server's limit")
        caps.append(Cap(capped.option, asked, limit))
        changes[capped.field] = limit
    if not caps:
        return config, ()
    return replace(config, data=replace(config.data, **changes), options=dict(config.options, **changes)), tuple(caps)


def caps_line(caps: tuple[Cap, ...]) -> str:
    """The one line that says which defaults the server's limits capped."""
    said = ", ".join(f"{cap.option} {cap.used:,} instead of the default {cap.asked:,}" for cap in caps)
    return f"the server's model publishes its limits: {said}"


def server_limits_section(limits: Limits | None, caps: tuple[Cap, ...]) -> dict | None:
    """report.json's run.server_limits: what the server published and the defaults it capped (None:
    it published nothing)."""
    if limits is None:
        return None
    return {"published": {field: getattr(limits, field) for field in LIMIT_PARAMETERS},
            "caps": [cap.as_dict() for cap in caps]}


def _published(field: str) -> str:
    return f"it publishes {LIMIT_PARAMETERS[field]}"
