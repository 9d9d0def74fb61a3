"""The documentation site builds with warnings as errors: every page in the nav, every link and anchor resolving."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    assert {"index.html", "reference/options/index.html", "benchmarks/index.html"} <= built
    # the README's install and quick start, included into the site rather than copied
    included = (tmp_path / "site" / "getting-started" / "index.html").read_text()
    assert "Quick start (five minutes)" in included and "--8&lt;--" not in included
