#!/usr/bin/env bash
# The test suite in HSTU_TEST_PROCESSES pytest processes (default 2) that share it module by module
# (tests/shards.py), with pytest's arguments passed on ("$@"); each prints its own summary and its 25
# slowest tests, the others' after the first's; the exit status is the first non-zero one.
# The quick loop while editing: bash scripts/run-tests.sh -m "not integration"
set -uo pipefail
cd "$(dirname "$0")/.."
PROCESSES=${HSTU_TEST_PROCESSES:-2}
HSTU_TEST_SHARED=$(mktemp -d)
export HSTU_TEST_SHARED
trap 'rm -rf "$HSTU_TEST_SHARED"' EXIT
others=()
for i in $(seq 2 "$PROCESSES"); do
    python -m pytest -q --durations=25 -p no:cacheprovider "$@" >"$HSTU_TEST_SHARED/process$i.log" 2>&1 &
    others+=("$!")
done
python -m pytest -q --durations=25 "$@"
status=$?
for i in "${!others[@]}"; do
    wait "${others[$i]}"
    code=$?
    echo "== test process $((i + 2)) of $PROCESSES (exit $code)"
    cat "$HSTU_TEST_SHARED/process$((i + 2)).log"
    [ "$status" -ne 0 ] || status=$code
done
exit "$status"
