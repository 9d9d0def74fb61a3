#!/usr/bin/env bash
# NVIDIA's benchmark protocol (`hstu-replay protocol run`) against the batched target on a GPU,
# 3 and 8 layers, each served by a real tritonserver on 127.0.0.1 (one server per config).
#   bash bench/gpu_protocol.sh OUT_DIR [USERS] [RUNS]
# ENGINE=aoti exports each config with AOTInductor first (`server export`) and serves the packages;
# ENGINE=batched-aoti serves the batched step compiled by AOTInductor (`serve` compiles it first).
# SERVE_ARGS adds options to `server serve` (e.g. "--frontend python-backend"); Triton's own statistics
# of each run (queue, input, model, output per request: bench/gpu_triton_stats.py) follow its table.
# CLIENT_PROTOCOLS (default grpc): each run once per client protocol, against the same server (http:
# under <config>-run<N>-http). REPOS (default OUT_DIR): where repository-<config> is kept, so that a
# second invocation serves the package a first one compiled.
# (DEVICE=cpu DTYPE=float32 CONFIGS=small HISTORY=256 CANDIDATES=16 SCALE=0.05 bash bench/gpu_protocol.sh
#  runs/x 32: the same on a CPU)
# Synthetic KuaiRand-1K users (full scale), each user's latest 100 events ranked after up to 4096
# before them; protocol.json/.html of every run under OUT_DIR/<config>-run<N>/, and at the end the
# runs side by side (each figure's lowest, median and highest: bench/protocol_runs.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?output folder}
USERS=${2:-128}
RUNS=${3:-2}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16} CONFIGS=${CONFIGS:-kuairand-1k kuairand-1k-8l}
ENGINE=${ENGINE:-batched} EXPORT_TIMEOUT=${EXPORT_TIMEOUT:-600} SERVE_ARGS=${SERVE_ARGS:-}
CLIENT_PROTOCOLS=${CLIENT_PROTOCOLS:-grpc} REPOS=${REPOS:-$OUT}
case "$SERVE_ARGS" in
    *cpp-backend*) FRONTEND="our C++ Triton backend (libtriton_hstu.so)" ;;
    *python-backend*) FRONTEND="Triton's Python backend (no proxy)" ;;
    *) FRONTEND="PyTriton's Python backend" ;;
esac
HISTORY=${HISTORY:-4096} CANDIDATES=${CANDIDATES:-100} SCALE=${SCALE:-1.0}
HW=${HARDWARE:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "$DEVICE")}
mkdir -p "$OUT"
$PY -m hstu_replay.cli data synth --out "$OUT/raw" --users "$USERS" --seed 5 --scale "$SCALE" || exit 1
$PY -m hstu_replay.cli data prepare "$OUT/raw" --out "$OUT/store" || exit 1
SERVER=
trap '[ -n "$SERVER" ] && kill -INT $SERVER 2>/dev/null; wait 2>/dev/null' EXIT
for cfg in $CONFIGS; do
    REPO="$REPOS/repository-$cfg"
    if [ "$ENGINE" = aoti ]; then
        start=$(date +%s)
        timeout "$EXPORT_TIMEOUT" $PY -m hstu_replay.cli server export --repository "$REPO" --config "$cfg" \
            --device "$DEVICE" >"$OUT/export-$cfg.log" 2>&1
        code=$?
        echo "== export $cfg: exit $code after $(( $(date +%s) - start )) s"
        tail -5 "$OUT/export-$cfg.log"
        [ $code -eq 0 ] || continue
    elif [ "$ENGINE" = batched-aoti ]; then  # compiled here, bounded, so that `serve` finds it compiled
        start=$(date +%s)
        timeout "$EXPORT_TIMEOUT" $PY -c "import sys; from hstu_replay.server.build import prepare_engine
from hstu_replay.server.model_config import get_config
prepare_engine('batched-aoti', sys.argv[1], get_config(sys.argv[2], sys.argv[3]), 0, 32, sys.argv[4])" \
            "$REPO" "$cfg" "$DTYPE" "$DEVICE" >"$OUT/export-$cfg.log" 2>&1
        code=$?
        echo "== batched step $cfg: exit $code after $(( $(date +%s) - start )) s"
        tail -5 "$OUT/export-$cfg.log"
        [ $code -eq 0 ] || continue
    fi
    read -r H G M C < <($PY -c "from hstu_replay.process import free_ports; print(*free_ports(4))")
    $PY -m hstu_replay.cli server serve --engine "$ENGINE" --repository "$REPO" --config "$cfg" \
        $( [ "$ENGINE" != aoti ] && echo --dtype "$DTYPE" ) --device "$DEVICE" \
        --http-port "$H" --grpc-port "$G" --metrics-port "$M" --cache-metrics-port "$C" $SERVE_ARGS >"$OUT/server-$cfg.log" 2>&1 &
    SERVER=$!
    $PY -m hstu_replay.cli server wait --http-port "$H" --pid $SERVER --log "$OUT/server-$cfg.log" --timeout 180 ||
        { tail -20 "$OUT/server-$cfg.log"; exit 1; }
    for run in $(seq 1 "$RUNS"); do
        for proto in $CLIENT_PROTOCOLS; do
            name=$cfg-run$run$( [ "$proto" != grpc ] && echo "-$proto" )
            echo "== $cfg run $run, $proto"
            $PY -m bench.gpu_triton_stats --http-port "$H" --save "$OUT/stats-before.json"
            $PY -m hstu_replay.cli protocol run --triton-url "127.0.0.1:$( [ "$proto" = http ] && echo "$H" || echo "$G" )" \
                --triton-protocol "$proto" --store "$OUT/store" --candidates "$CANDIDATES" \
                --max-history "$HISTORY" --max-values 70000 --out "$OUT/$name" \
                --hardware "$HW; $cfg, $ENGINE engine$( [ "$ENGINE" != aoti ] && echo " $DTYPE") behind $FRONTEND, $proto"
            echo "== $cfg run $run, $proto: exit $?"
            $PY -m bench.gpu_triton_stats --http-port "$H" --since "$OUT/stats-before.json"
        done
    done
    kill -INT $SERVER; wait $SERVER; SERVER=
done
echo "== every run of this invocation, side by side (bench/protocol_runs.py)"
$PY -m bench.protocol_runs "$OUT"
