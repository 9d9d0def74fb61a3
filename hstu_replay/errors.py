"""The exception tree. Every error the tool expects carries a one-line message and an exit code.

`cli.main` is the single place that turns these into a line on stderr and a process exit status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class HstuReplayError(Exception):
    """Base of every expected failure: the message is one line a user can act on."""

    exit_code = 1


class ConfigError(HstuReplayError):
    """A bad option or option combination, found before any work starts."""

    exit_code = 2


class InputError(HstuReplayError):
    """A data file (CSV, store, dump) that is malformed, truncated, hostile or missing."""


class RawDataError(InputError):
    """A raw log or feature file `data prepare` cannot use (missing, cut off, reordered, malformed)."""

    exit_code = 2


class OutputError(HstuReplayError):
    """An output that could not be written (a full disk): nothing half-written is published."""

    exit_code = 2


class LimitError(HstuReplayError):
    """A request outside the model's published limits; it is refused before it is sent."""


class PlanError(HstuReplayError):
    """A step the workload cannot plan (too few distinct users for the batch)."""


class InterfaceMismatch(HstuReplayError):
    """A served model whose inputs/outputs match none of the known HSTU interfaces."""

    exit_code = 2


class ServerError(HstuReplayError):
    """The server could not be reached, started or used."""

    exit_code = 2


class AccessDenied(ServerError):
    """The server turned the request away for its credentials (a missing or wrong header)."""


class ServerUnavailable(ServerError):
    """The server did not take the request at all (connection refused, gRPC UNAVAILABLE)."""


class ProtocolError(ServerError):
    """An answer that breaks its protocol's syntax or framing: the connection is not used again."""


def opened_by_option(flag: str, path, opener: Callable[..., T]) -> T:
    """`opener(path)` for the file or folder option `flag` names: a missing, foreign or corrupt one
    (any HstuReplayError of the opener) becomes one ConfigError line naming the option, exit 2."""
    if not path:
        raise ConfigError(f"{flag} is required")
    try:
        return opener(path)
    except HstuReplayError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise ConfigError(f"{flag} {path}: {reason}") from None
