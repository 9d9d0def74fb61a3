"""What a web form may change before a run: checked before Locust's /swarm takes it.

Locust's /swarm copies every form field whose name is a parsed option into the options, whether
the form shows that option or not. Here a submitted form is refused (one message in the UI, no
load started) when it names anything but Locust's own fields and the options the form shows;
paths only below `--web-paths-root` (after resolving symlinks and '..'); the target address (the
Host field) only with `--web-edit-target`; secrets never. A form that passes is tried as a
config first, so a bad value is refused there too.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

from hstu_replay.errors import ConfigError
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.loadtest.options import (ADDRESS_OPTIONS, OPTIONS, PATH_OPTIONS, SECRETS, WEB_EDIT_TARGET,
                                          WEB_PATHS_ROOT)

LOCUST_FIELDS = frozenset({"user_count", "spawn_rate", "host", "run_time", "user_classes", "shape_class", "profile"})
OPTION_FIELDS = frozenset(o.dest for o in OPTIONS)


def form_name(dest: str) -> str:
    """The name Locust's web form submits an option under: its page camel-cases the option for
    the field and snake-cases it back on submit, which splits digits (max_p99_ms -> max_p9_9ms)."""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), dest)
    return re.sub(r"([a-z0-9])([A-Z0-9])", r"\1_\2", camel).lower()


#: Submitted field name -> option, where the form's round trip renames it (Locust's /swarm then
#: ignores the field: `apply_renamed` sets the option instead).
RENAMED = {form_name(name): name for name in OPTION_FIELDS if form_name(name) != name}


@dataclass(frozen=True)
class FormPolicy:
    paths_root: Path | None  # path options editable below this directory; None: not at all
    edit_target: bool  # the Host field (target address) editable

    @classmethod
    def from_options(cls, parsed) -> FormPolicy:
        root = getattr(parsed, WEB_PATHS_ROOT.dest, "") or ""
        if root and not Path(root).is_dir():
            raise ConfigError(f"{WEB_PATHS_ROOT.flag} {root!r}: not a directory")
        return cls(Path(root).resolve() if root else None, bool(getattr(parsed, WEB_EDIT_TARGET.dest, False)))


installed: FormPolicy | None = None  # this process's, once its web UI is up (Locust re-creates its parser)


def show_paths(parser, policy: FormPolicy | None) -> None:
    """The form shows the path options only when they may be changed from it."""
    for action in parser._actions:
        if action.dest in PATH_OPTIONS:
            action.include_in_web_ui = policy is not None and policy.paths_root is not None


def check_form(form, options, host: str | None, policy: FormPolicy, secrets: dict) -> None:
    """Raise ConfigError naming the first field the form may not set, or the first bad value."""
    trial = dict(vars(options))
    for submitted in form.keys():
        value, key = form.get(submitted), RENAMED.get(submitted, submitted)
        if key in LOCUST_FIELDS:
            continue
        if key in SECRETS:
            raise ConfigError(f"{key} is secret: give it on each process's command line or environment, "
                              "not in the web form")
        if key in ADDRESS_OPTIONS:
            raise ConfigError(f"{key}: the target address is the Host field")
        if key not in OPTION_FIELDS:
            raise ConfigError(f"{key}: not an option the web form may set")
        if key in PATH_OPTIONS and value != str(getattr(options, key, "")):
            _check_path(key, value, policy.paths_root)
        trial[key] = _as_locust_sets(trial.get(key), value)
    new_host = form.get("host", host)
    if new_host != host and (host or new_host):
        if not policy.edit_target:
            raise ConfigError(f"the target address is fixed to {host} (start with --web-edit-target to change it "
                              "from the web form)")
        if (new_host or "").strip().startswith("@"):
            raise ConfigError("the Host field takes addresses (a fleet's comma-separated), not an @file to read")
    LoadTestConfig.from_options(argparse.Namespace(**trial), host=new_host, secrets=secrets)


def _check_path(key: str, value: str, root: Path | None) -> None:
    flag = "--" + key.replace("_", "-")
    if root is None:
        raise ConfigError(f"{flag}: paths are fixed (start with --web-paths-root DIR to edit them below DIR)")
    if not value:
        return  # unset
    resolved = Path(value).resolve()
    if not resolved.is_relative_to(root):
        raise ConfigError(f"{flag} {value!r} resolves to {resolved}, outside --web-paths-root {root}")


def apply_renamed(form, options) -> None:
    """Set the options whose fields the form renamed (a checked form), as /swarm sets the others."""
    for submitted, key in RENAMED.items():
        if submitted in form:
            setattr(options, key, _as_locust_sets(getattr(options, key, None), form.get(submitted)))


def _as_locust_sets(current, value: str):
    """The value Locust's /swarm stores for a form field (it keeps the option's type)."""
    if isinstance(current, bool):
        return value == "true"
    if current is None:
        return value
    try:
        return type(current)(value)
    except (TypeError, ValueError):
        return value  # the config names the option and the value


def install(environment, policy: FormPolicy, secrets: dict) -> None:
    """Check every /swarm form before Locust's handler applies it."""
    from flask import jsonify, request

    global installed
    installed = policy
    @environment.web_ui.app.before_request
    def refuse_what_the_form_may_not_set():
        if request.method != "POST" or not request.path.endswith("/swarm"):
            return None
        try:
            check_form(request.form, environment.parsed_options, environment.host, policy, secrets)
        except ConfigError as exc:
            print(f"hstu-replay: web form refused: {exc}", flush=True)
            return jsonify({"success": False, "message": str(exc), "host": environment.host})
        apply_renamed(request.form, environment.parsed_options)
        return None
