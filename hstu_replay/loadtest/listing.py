"""`hstu-replay options`: every option registered on Locust's parser, its default, its environment
variable and how the web form treats it, by group.

Locust reads `--help` before it loads a locustfile, so `locust -f locustfiles/hstu.py --help`
shows Locust's own options only; this listing is where hstu-replay's options are found from the
command line. It reads the one option table (`loadtest.options`: `REGISTERED`, and the Locust
options read differently here, `LOCUST_OWN`), in the groups a loaded locustfile's parser uses,
and writes it as text, as the README's markdown table rows or as JSON. Locust-free, so it answers
at once.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from hstu_replay.loadtest.options import GROUPS, LOCUST_OWN, REGISTERED


@dataclass(frozen=True)
class ListedOption:
    group: str
    flag: str
    env_var: str
    default: str  # as the README's table shows it: '' for none, 'off' for a switch
    help: str
    form: str = ""  # how the web form treats it (loadtest.options.WebForm's word): '' not in the form


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
    """Every option, group by group in registration order; Locust's own first in their group."""
    rows = []
    for group in GROUPS:
        rows += [ListedOption(group, o.flag, o.env_var, o.unset or shown_default(o.default), o.help, o.form.value)
                 for o in LOCUST_OWN if o.group == group]
        rows += [ListedOption(group, o.flag, o.env_var, shown_default(o.arg_default), o.help, o.form.value)
                 for o in REGISTERED if o.group == group]
    return rows


def as_text(rows: list[ListedOption]) -> str:
    width = max(len(r.flag) for r in rows)
    env_width = max(len(r.env_var) for r in rows)
    form_width = max(len(r.form) for r in rows)
    lines = ["hstu-replay load-test options (locust -f locustfiles/hstu.py ...; also in locust.conf without the "
             "leading --, or as the environment variable); then how the web form treats it: a field ('form'; paths: "
             "'form in root', with --web-paths-root), the 'Host field' (with --web-edit-target), not shown, or "
             "'secret'"]
    group = None
    for r in rows:
        if r.group != group:
            group = r.group
            lines += ["", f"{group}:"]
        default = f" (default: {r.default})" if r.default else ""
        lines.append(f"  {r.flag:<{width}}  {r.env_var:<{env_width}}  {r.form:<{form_width}}  {r.help}{default}")
    return "\n".join(lines)


def as_markdown(rows: list[ListedOption]) -> str:
    """The README's table layout: option, env, default, meaning (a row per option, groups in order)."""
    lines = ["| option | env | default | meaning |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.flag}` | `{r.env_var}` | {f'`{r.default}`' if r.default else ''} | {r.help} |" for r in rows]
    return "\n".join(lines)


def as_json(rows: list[ListedOption]) -> str:
    """One object per option, the fields of `ListedOption` (for tools that read the listing)."""
    return json.dumps([asdict(r) for r in rows], indent=1)


FORMATS = {"text": as_text, "markdown": as_markdown, "json": as_json}


def add_commands(groups) -> None:
    parser = groups.add_parser("options", help="list every load-test option, its default and environment variable",
                               description=" ".join(__doc__.split("\n\n")[0].split()),
                               epilog="example: hstu-replay options --group web")
    parser.add_argument("--format", choices=tuple(FORMATS), default="text", help="text (default), markdown or json")
    parser.add_argument("--group", default="", help="only the groups whose name contains this (case-insensitive)")
    parser.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    rows = [r for r in listed_options() if args.group.lower() in r.group.lower()]
    if not rows:
        from hstu_replay.errors import ConfigError

        raise ConfigError(f"--group {args.group!r}: no such group; groups: {', '.join(GROUPS)}")
    print(FORMATS[args.format](rows))
    return 0
