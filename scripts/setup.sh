#!/usr/bin/env bash
# Create .venv (if missing) and install hstu-replay with the reference target, test and docs extras
# (gpu: triton, whose CPU interpreter the tests run the attention kernel in; docs: mkdocs-material and
# the offline Kubernetes schemas the deploy/ manifests are checked against).
# torch==2.13.0 goes first: any other torch spec may pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[target,gpu,bench,test,docs]"
