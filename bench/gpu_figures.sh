#!/usr/bin/env bash
# The batched engine's figures on an NVIDIA GPU (needs torch with CUDA and triton; nothing to compile).
#   bash bench/gpu_figures.sh [agreement|profile|in-process|triton|locust ...]   # default: all
# Everything printed also goes to ${OUT:-runs/gpu}/figures.log. Each step is bounded by `timeout`;
# a failed step does not stop the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
COMMON=(--engine batched --dtype bfloat16 --device cuda --history 4096 --candidates 100)

step() {  # name, seconds, command...
    local name=$1 seconds=$2; shift 2
    echo "== $name: $*" | tee -a "$OUT/figures.log"
    timeout "$seconds" "$@" 2>&1 | tee -a "$OUT/figures.log"
    echo "== $name: exit ${PIPESTATUS[0]}" | tee -a "$OUT/figures.log"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    nproc
} 2>&1 | tee -a "$OUT/figures.log"

PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(agreement profile in-process triton locust)
for part in "${PARTS[@]}"; do
    case $part in
    agreement)
        step agreement 150 $PY bench/engine_agreement.py --config kuairand-1k --history 4096 --candidates 100 --batch 4 ;;
    profile)
        step profile 120 $PY bench/profile_batched.py --config kuairand-1k --batch 8 ;;
    in-process)
        for cfg in kuairand-1k kuairand-1k-8l; do
            step "in-process-$cfg" 240 $PY bench/target_latency_bench.py "${COMMON[@]}" --config "$cfg" \
                --batches 1,2,8 --repeats 10 --modes in-process
        done ;;
    triton)
        for cfg in kuairand-1k kuairand-1k-8l; do
            step "triton-$cfg" 300 $PY bench/target_latency_bench.py "${COMMON[@]}" --config "$cfg" \
                --batches 1,2,8 --repeats 10 --modes triton
        done ;;
    locust)
        step locust 420 bash bench/gpu_locust.sh runs/gpu-locust
        cp runs/gpu-locust/report/report.json "$OUT/locust-report.json"
        tail -40 runs/gpu-locust/server.log > "$OUT/locust-server-tail.log" ;;
    *) echo "unknown part $part"; exit 2 ;;
    esac
done
