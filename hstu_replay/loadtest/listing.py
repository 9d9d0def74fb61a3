"""`hstu-replay options`: every load-test option, its default and its environment variable, by group.

Locust reads `--help` before it loads a locustfile, so `locust -f locustfiles/hstu.py --help`
shows Locust's own options only; this listing is where the load test's options are found from
the command line. It reads the one option table (`loadtest.options.OPTIONS`), in the groups the
web form and a loaded locustfile's parser use, and writes it as text or as the README's markdown
table rows. Locust-free, so it answers at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hstu_replay.loadtest.address import DEFAULT_ADDRESS
from hstu_replay.loadtest.options import BY_DEST, GROUPS, OPTIONS, TARGET

#: Locust's own --host, which the load test reads as the Triton address (listed in its group).
HOST_HELP = ("The Triton address: grpc://host:8001, http://host:8000, https:// (HTTP + TLS), grpcs:// (gRPC + TLS); "
             "the web form's Host field")


@dataclass(frozen=True)
class ListedOption:
    group: str
    flag: str
    env_var: str
    default: str  # as the README's table shows it: '' for none, 'off' for a switch
    help: str


def shown_default(value) -> str:
    """A default as a user types it: no value '', a switch 'off', whole numbers without '.0'."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def listed_options() -> list[ListedOption]:
    """Every option, group by group in the web form's order; Locust's --host first in its group."""
    rows = []
    for group in GROUPS:
        if group == TARGET:
            host = f"{BY_DEST['triton_protocol'].default}://{DEFAULT_ADDRESS}"  # what an unset --host means
            rows.append(ListedOption(group, "--host", "LOCUST_HOST", host, HOST_HELP))
        rows += [ListedOption(group, o.flag, o.env_var, shown_default(o.arg_default), o.help)
                 for o in OPTIONS if o.group == group]
    return rows


def as_text(rows: list[ListedOption]) -> str:
    width = max(len(r.flag) for r in rows)
    env_width = max(len(r.env_var) for r in rows)
    lines = ["hstu-replay load-test options (locust -f locustfiles/hstu.py ...; also in locust.conf without the "
             "leading --, or as the environment variable)"]
    group = None
    for r in rows:
        if r.group != group:
            group = r.group
            lines += ["", f"{group}:"]
        default = f" (default: {r.default})" if r.default else ""
        lines.append(f"  {r.flag:<{width}}  {r.env_var:<{env_width}}  {r.help}{default}")
    return "\n".join(lines)


def as_markdown(rows: list[ListedOption]) -> str:
    """The README's table layout: option, env, default, meaning (a row per option, groups in order)."""
    lines = ["| option | env | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.flag}` | `{r.env_var}` | {f'`{r.default}`' if r.default else ''} | {r.help} |" for r in rows]
    return "\n".join(lines)


FORMATS = {"text": as_text, "markdown": as_markdown}


def add_commands(groups) -> None:
    parser = groups.add_parser("options", help="list every load-test option, its default and environment variable",
                               description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=tuple(FORMATS), default="text", help="text (default) or markdown")
    parser.add_argument("--group", default="", help="only the groups whose name contains this (case-insensitive)")
    parser.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    rows = [r for r in listed_options() if args.group.lower() in r.group.lower()]
    if not rows:
        from hstu_replay.errors import ConfigError

        raise ConfigError(f"--group {args.group!r}: no such group; groups: {', '.join(GROUPS)}")
    print(FORMATS[args.format](rows))
    return 0
