#!/usr/bin/env bash
# Set up, then run the whole test suite (unit and integration, real tritonserver and locust; the
# documentation site is built with warnings as errors by tests/docs/test_site.py) in two pytest
# processes sharing it (scripts/run-tests.sh), printing the slowest tests at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# A real browser for the web UI test (tests/loadtest/test_browser.py): Debian's chromium, driven
# by Playwright (test extra) as the system browser; Playwright's own browser download is not used.
if [ ! -x /usr/bin/chromium ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium
fi
# The gateway in front of a fleet of reference servers (tests/fleet): Debian's HAProxy.
if [ ! -x /usr/sbin/haproxy ]; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -q
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy
fi
. .venv/bin/activate
bash scripts/run-tests.sh "$@"
