#!/usr/bin/env bash
# Our Locust tool against the batched target on a GPU, through a real tritonserver (127.0.0.1):
# synthetic KuaiRand-1K sessions, full-length histories, batch 8, hit ratios 0..1.
#   bash bench/gpu_locust.sh OUT_DIR [CONFIG]
# (DEVICE=cpu HISTORY=256 CANDIDATES=32 bash bench/gpu_locust.sh runs/x small: the same on a CPU; STAGE_SECONDS: each
# stage's length, default 6)
# SERVE_ARGS adds options to `server serve` (e.g. "--frontend python-backend"); ENGINE names its engine
# (default batched; batched-aoti for "--frontend cpp-backend").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?output folder}
CONFIG=${2:-kuairand-1k}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda} HISTORY=${HISTORY:-4096} CANDIDATES=${CANDIDATES:-100} SERVE_ARGS=${SERVE_ARGS:-}
ENGINE=${ENGINE:-batched}
mkdir -p "$OUT"
$PY -m hstu_replay.cli data synth --out "$OUT/raw" --users 24 --seed 5 --scale 1.0 || exit 1
$PY -m hstu_replay.cli data prepare "$OUT/raw" --out "$OUT/store" || exit 1
$PY -m hstu_replay.cli server serve --engine "$ENGINE" --config "$CONFIG" --dtype bfloat16 --device "$DEVICE" \
    --http-port 18000 --grpc-port 18001 --metrics-port 18002 --cache-metrics-port 18003 $SERVE_ARGS >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
$PY -m hstu_replay.cli server wait --http-port 18000 --pid $SERVER --log "$OUT/server.log" --timeout 240 ||
    { tail -20 "$OUT/server.log"; exit 1; }
$PY -m locust -f locustfiles/hstu.py --headless --only-summary -u 1 -r 1 \
    --triton-url 127.0.0.1:18001 --workload sessions --store "$OUT/store" --candidates "$CANDIDATES" \
    --max-history "$HISTORY" --max-values 70000 --hit-ratios 0,0.25,0.5,0.75,0.9,1.0 --batch-sizes 1,8 \
    --stage-seconds "${STAGE_SECONDS:-6}" --warmup-seconds 2 --report-dir "$OUT/report" --loglevel WARNING
echo "locust exit $?"
