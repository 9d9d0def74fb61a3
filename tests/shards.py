"""Two (or more) pytest processes sharing one suite, module by module (`scripts/test.sh`).

pytest-xdist's workers wait on threads that gevent's monkey-patching (done by importing locust,
which several tests do in-process) turns into greenlets, and hang; so the suite runs as N plain
pytest processes instead. Each collects everything, then claims whole test modules one at a time
from a folder they share (`HSTU_TEST_SHARED`, created by the caller), so a module's fixtures are
set up once, a slow module keeps one process busy while the other takes the rest, and every test
runs exactly once. Modules with integration tests are claimed first, the quick ones fill the end.
Without `HSTU_TEST_SHARED` pytest runs as usual.

What both processes build once (compiled repositories, stores, dumps) lives in that folder too
(`tests/conftest.py` `built_once`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

SHARED_ENV = "HSTU_TEST_SHARED"


def shared_folder() -> Path | None:
    """The folder the processes of one run share, or None when pytest runs alone."""
    value = os.environ.get(SHARED_ENV)
    return Path(value) if value else None


def _claim(folder: Path, module: str) -> bool:
    """True for exactly one process of the run (an exclusive create)."""
    try:
        os.close(os.open(folder / "claims" / module.replace("/", "__"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _modules(items: list[pytest.Item]) -> list[list[pytest.Item]]:
    """The items grouped by module, in collection order, modules with integration tests first."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(groups.values(), key=lambda g: not any(i.get_closest_marker("integration") for i in g))
    return ordered


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session):
    folder = shared_folder()
    if folder is None or session.config.option.collectonly:
        return None  # pytest's own loop
    (folder / "claims").mkdir(parents=True, exist_ok=True)
    mine: Iterator[list[pytest.Item]] = (g for g in _modules(session.items)
                                          if _claim(folder, g[0].nodeid.split("::")[0]))
    current = next(mine, None)
    while current is not None:
        following = None
        for i, item in enumerate(current):
            if i + 1 < len(current):
                nextitem = current[i + 1]
            else:  # claimed before the module's last test ends, so session fixtures live on
                following = next(mine, None)
                nextitem = following[0] if following else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
            if session.shouldfail:
                raise session.Failed(session.shouldfail)
            if session.shouldstop:
                raise session.Interrupted(session.shouldstop)
        current = following
    return True
