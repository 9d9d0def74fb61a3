"""What a server says of its model's limits: published in the model's configuration, or learnt
from a refusal.

A server may publish its limits as `parameters` of the served model's configuration (Triton's
model config endpoint), one parameter per limit under the names of `interface.LIMIT_PARAMETERS`.
A server that publishes none (NVIDIA's) says a limit only by refusing a request beyond it:
`limit_refusal` reads such an error text and names the load-test option that sets what was refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hstu_replay.errors import ServerError
from hstu_replay.interface import LIMIT_PARAMETERS, Limits


def published_limits(model_config: Mapping) -> Limits | None:
    """The limits a model configuration (tritonclient's `get_model_config` as JSON: gRPC's wraps it
    in "config", HTTP's is the config itself) publishes; None when it publishes none."""
    config = model_config.get("config", model_config)
    parameters = config.get("parameters") or {}
    given = {field: name for field, name in LIMIT_PARAMETERS.items() if name in parameters}
    if not given:
        return None
    missing = [name for field, name in LIMIT_PARAMETERS.items() if field not in given]
    if missing:
        raise ServerError(f"model {config.get('name', '?')!r} publishes some of its limits but not "
                          f"{', '.join(missing)}: a server publishes all of {', '.join(LIMIT_PARAMETERS.values())} "
                          "or none")
    values = {}
    for field, name in given.items():
        entry = parameters[name]
        text = str(entry.get("string_value", "") if isinstance(entry, Mapping) else entry).strip()
        if not text.isdigit() or int(text) < 1:
            raise ServerError(f"model {config.get('name', '?')!r} publishes {name} {text!r}: not a whole number "
                              "of at least 1")
        values[field] = int(text)
    return Limits(**values)


@dataclass(frozen=True)
class RefusedLimit:
    """A refusal that names a limit: what was refused, the option that sets it, the limit if said."""

    what: str  # "a history of 2,481 items"
    option: str  # the load-test option that sets it
    limit: int | None  # the server's limit, when its error says it

    def line(self) -> str:
        said = (f"its limit is {self.limit:,}; set {self.option} {self.limit} or less" if self.limit is not None
                else f"its limit is below that; set {self.option}")
        return f"the server refused {self.what}: {said}"


@dataclass(frozen=True)
class RefusalText:
    """An error text of a server that names a limit (`pattern`'s groups: value and, where said, limit)."""

    pattern: re.Pattern
    what: str  # formatted with the refused value
    option: str


#: the refusals of the reference server's frontends and of NVIDIA's published model that name a limit
REFUSALS: tuple[RefusalText, ...] = (
    RefusalText(re.compile(r"history of (?P<value>\d+) items exceeds (?P<limit>\d+)"), "a history of {:,} items",
                "--max-history"),
    RefusalText(re.compile(r"(?P<value>\d+) candidates exceed (?P<limit>\d+)"), "{:,} candidates per user",
                "--candidates"),
    RefusalText(re.compile(r"batch of (?P<value>\d+) users; the model takes at most (?P<limit>\d+)"),
                "a batch of {:,} users", "--batch-sizes"),
)


def limit_refusal(error: str) -> RefusedLimit | None:
    """The limit a failed request's error text names; None for any other failure."""
    for refusal in REFUSALS:
        found = refusal.pattern.search(error)
        if found is not None:
            limit = found.groupdict().get("limit")
            return RefusedLimit(refusal.what.format(int(found["value"])), refusal.option,
                                int(limit) if limit is not None else None)
    return None
