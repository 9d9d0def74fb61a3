"""The options page against Locust's own parser: the environment variable and default Locust gives
each option once the locustfile has registered it (an independent reading of the option table)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "options.md"
ROW = re.compile(r"^\| `(--[a-z0-9-]+)` \| `(LOCUST_[A-Z0-9_]+)` \| (?:`([^`]*)`)? \|", re.M)
#: Locust's parser, built in a child process (the locustfile patches gevent and registers its listeners)
READ_PARSER = """
import json, hstu_replay.locustfile
from locust.argument_parser import get_parser
print(json.dumps({a.option_strings[-1]: [getattr(a, "env_var", None), a.default]
                  for a in get_parser()._actions if a.option_strings}, default=str))
"""


def _locust_options() -> dict[str, list]:
    done = subprocess.run([sys.executable, "-c", READ_PARSER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def _same_default(shown: str, value) -> bool:
    if shown in ("", "off"):
        return value in (None, "", False, "False", "None")
    if shown == "on":
        return value in (True, "True")
    try:
        return float(shown) == float(value)
    except (TypeError, ValueError):
        return shown == str(value)


def test_every_documented_option_has_locust_s_environment_variable_and_default():
    locust = _locust_options()
    rows = ROW.findall(PAGE.read_text())
    assert len(rows) > 30
    wrong = []
    for flag, env, default in rows:
        if flag == "--host":  # Locust's own option: the load test reads an unset --host as its default address
            assert locust[flag][0] == env
            continue
        env_var, value = locust.get(flag, [None, None])
        if env_var != env or not _same_default(default, value):
            wrong.append((flag, env, default, env_var, value))
    assert not wrong, wrong
