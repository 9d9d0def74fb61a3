#!/usr/bin/env bash
# Set up, then run the whole test suite (unit and integration, real tritonserver and locust).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
