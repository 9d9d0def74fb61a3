#!/usr/bin/env bash
# The main job, end to end on this machine: set up, synthesize and prepare KuaiRand-1K data, compile
# and serve the reference HSTU target on a real tritonserver (127.0.0.1), write reference dumps,
# then run a short headless hit-ratio sweep with verification and leave the HTML report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate

OUT=${OUT:-runs/demo}
REPO=${REPO:-runs/model_repository}
HTTP_PORT=${HTTP_PORT:-8000} GRPC_PORT=${GRPC_PORT:-8001} METRICS_PORT=${METRICS_PORT:-8002}
CACHE_METRICS_PORT=${CACHE_METRICS_PORT:-8003}
FRONTEND=${FRONTEND:-pytriton}  # or python-backend, or cpp-backend (our C++ Triton backend)
mkdir -p "$OUT"

# Synthetic KuaiRand-1K (same schema as the real files; see datasets/README.md for the real data)
hstu-replay data synth --out "$OUT/raw" --users 16 --seed 5 --scale 0.1
hstu-replay data prepare "$OUT/raw" --out "$OUT/store"
hstu-replay data inspect "$OUT/store" | head -4
hstu-replay server dump --repository "$REPO" --store "$OUT/store" --out "$OUT/dumps" \
    --batches 24 --batch-size 8 --candidates 16 --min-history 200

hstu-replay server serve --repository "$REPO" --http-port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
    --metrics-port "$METRICS_PORT" --cache-metrics-port "$CACHE_METRICS_PORT" --frontend "$FRONTEND" \
    >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -INT $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
hstu-replay server wait --http-port "$HTTP_PORT" --pid $SERVER --log "$OUT/server.log" --timeout 60 ||
    { tail -20 "$OUT/server.log"; exit 1; }

locust -f locustfiles/hstu.py --headless --only-summary -u 1 -r 1 \
    --host "grpc://127.0.0.1:$GRPC_PORT" --workload dumps --dump-dir "$OUT/dumps" \
    --hit-ratios 0,0.25,0.5,0.75,0.9,1.0 --batch-sizes 8 --stage-seconds 6 --warmup-seconds 1 \
    --max-history 256 --max-values 40000 --report-dir "$OUT/report" --max-mismatches 0 \
    --loglevel WARNING
