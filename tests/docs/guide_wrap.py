"""How a guide's `locust` and `hstu-replay` commands run under tests/docs/test_guide_commands.py.

The block's shell calls `python -m tests.docs.guide_wrap locust|hstu-replay ARGS...` for each
command. The command runs as written, with three changes a reader's terminal does not need:
- runs are shortened: a headless or master Locust run gets `--stage-seconds 2 --warmup-seconds 0.5`
  appended (the last value of an option wins), capacity searches `--step-seconds 2 --warmup-seconds 0.5`;
- a headless run's report is read afterwards: a stage with a failed or mismatched request fails
  the command (exit 1), as a reader would count that guide broken; a threshold failure (exit 3)
  that only the machine's flags caused (a shortened stage is thin; a loaded 2-core machine's client
  lags: tests/conftest.py MACHINE_FLAGS) passes, as the suite's other runs judge them;
- the web UI (Locust without --headless, --master or --worker) is started, asked for its page
  and stopped, rather than left serving.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hstu_replay.loadtest.finish import THRESHOLD_EXIT_CODE
from tests.conftest import beyond_the_machine

SHORT_STAGES = ("--stage-seconds", "2", "--warmup-seconds", "0.5")
SHORT_STEPS = ("--step-seconds", "2", "--warmup-seconds", "0.5")
WEB_UI_WAIT_S = 90.0
DEFAULT_REPORT_DIR = "runs/latest"  # the load test's --report-dir default


def _value(args: list[str], flag: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return default


def failing_stages(report: dict) -> list[str]:
    """One line per stage that had a failed or mismatched request."""
    return [f"{b['name']}: {b['errors']} failed, {b['mismatches']} mismatched of {b['requests']}"
            for b in report["bins"] if b["errors"] or b["mismatches"]]


def _headless(args: list[str]) -> int:
    report_dir = Path(_value(args, "--report-dir", DEFAULT_REPORT_DIR))
    code = subprocess.call(["locust", *args, *SHORT_STAGES])
    report = report_dir / "report.json"
    if not report.exists():
        print(f"guide check: no {report} after the run (exit {code})", file=sys.stderr)
        return code or 1
    written = json.loads(report.read_text())
    failing = failing_stages(written)
    if failing:
        print("guide check: stages with failures: " + "; ".join(failing), file=sys.stderr)
        return code or 1
    if code == THRESHOLD_EXIT_CODE and not beyond_the_machine(written["thresholds"]["violations"]):
        print("guide check: only the machine's flags failed the thresholds: passed", file=sys.stderr)
        return 0
    return code


def _web_ui(args: list[str]) -> int:
    port = int(_value(args, "--web-port", "8089"))
    process = subprocess.Popen(["locust", *args, "--web-host", "127.0.0.1"], start_new_session=True)
    deadline = time.monotonic() + WEB_UI_WAIT_S
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as page:
                    if page.status == 200 and b"locust" in page.read().lower():
                        print(f"guide check: the web UI answered on 127.0.0.1:{port}", file=sys.stderr)
                        return 0
            except OSError:
                time.sleep(0.5)
        print(f"guide check: the web UI never answered on 127.0.0.1:{port} (exit {process.poll()})", file=sys.stderr)
        return 1
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def locust(args: list[str]) -> int:
    if "--worker" in args:
        os.execvp("locust", ["locust", *args])
    if "--headless" in args or "--master" in args:
        return _headless(args)
    return _web_ui(args)


def hstu_replay(args: list[str]) -> int:
    extra = SHORT_STEPS if args[:2] in (["capacity", "run"], ["capacity", "natural"]) else ()
    os.execvp("hstu-replay", ["hstu-replay", *args, *extra])


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    sys.exit({"locust": locust, "hstu-replay": hstu_replay}[command](rest))
