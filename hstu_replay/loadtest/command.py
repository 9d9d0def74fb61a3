"""The Locust command line of a run of hstu-replay's locustfile, for every tool that starts one
as a child process (the capacity drivers, the benchmarks, the tests). Torch- and locust-free."""

from __future__ import annotations

import sys
from pathlib import Path

from hstu_replay import LOCUSTFILE


def locust_command(*args: str, locustfile: Path | str = LOCUSTFILE) -> list[str]:
    """`locust -f <locustfile> ARGS` with this interpreter's Locust."""
    return [sys.executable, "-m", "locust", "-f", str(locustfile), *args]


def headless_command(report_dir: Path | str, *args: str, loglevel: str = "WARNING") -> list[str]:
    """One headless run that prints only its summary and writes its report into `report_dir`."""
    return locust_command("--headless", "--only-summary", "--loglevel", loglevel, "--report-dir", str(report_dir),
                          *args)
