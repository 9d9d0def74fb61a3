#!/usr/bin/env bash
# Several GPU-machine steps in one call, each bounded by its own time limit, logs under OUT_DIR:
#   bash bench/gpu_session.sh OUT_DIR STEP:SECONDS ...
# Steps:
#   wheels        install the carried wheels (bench/gpu_wheels.sh --install $WHEELS, default .whl) into the
#                 machine's Python environment
#   env           the machine, its Python packages and tools
#   aoti-check    compile and load a tiny AOTInductor package in one process (bench/gpu_aoti_check.py)
#   gpu-tests     the unit tests that need a GPU (CUDA graphs against eager, the batched-aoti package against eager,
#                 the C++ backend's kernel and CUDA graphs against eager)
#   protocol      NVIDIA's protocol against the batched engine, 3 and 8 layers (bench/gpu_protocol.sh)
#   protocol-eager the same with the batched engine's CUDA graphs off (HSTU_REPLAY_CUDA_GRAPHS=0)
#   protocol-pyt  the same behind PyTriton (the baseline), 3 layers
#   protocol-aoti the same on AOTInductor packages compiled there (ENGINE=aoti), 3 layers
#   protocol-baot the same on the batched step compiled there by AOTInductor (ENGINE=batched-aoti), 3 layers
#   cpp-build     build our C++ Triton backend (cpp/backend) against the machine's torch
#   protocol-cpp  NVIDIA's protocol against that backend serving the batched step (CPP_CONFIGS, default 3 and 8
#                 layers; CLIENT_PROTOCOLS as bench/gpu_protocol.sh takes them; CPP_SERVE_ARGS: more `serve`
#                 options, e.g. "--cache-budget-tokens 1200000" on an 80 GB card, where the published budget's
#                 pool at 8 layers, 50 GiB, cannot grow by copying)
#   package-source the C++ wrapper AOTInductor wrote for each package protocol-cpp compiled (which kernels run,
#                 on which buffers), as package-source-<config>.cpp
#   protocol-cpp-graphs the same with the backend's CUDA graphs on (HSTU_REPLAY_CUDA_GRAPHS=1), on the packages
#                 protocol-cpp compiled
#   attention-tune the attention kernel's launches on the protocol's cold and cached shapes, and the eager
#                 step's time, and the batched-aoti package's (the one protocol-cpp serves, compiled
#                 here when protocol-cpp has not run), each step's kernels (bench/gpu_attention_tune.py;
#                 TUNE_ARGS: more options, e.g. --default-launch)
#   profile       where a served batch-8 request's time goes (bench/gpu_serving_profile.py), Python backend
#                 with CUDA graphs and without; the backend's phase lines (HSTU_REPLAY_BACKEND_PHASES)
#   profile-cpp   the same against our C++ backend, on the package protocol-cpp compiled (else compiled here)
#   locust        our Locust sweep (bench/gpu_locust.sh; SERVE_ARGS as for protocol)
#   locust-cpp    the same against our C++ backend, on the package protocol-cpp compiled
#   flow          `hstu-replay flow l0 --config kuairand-1k` on the GPU (FLOW_ARGS: more options, e.g.
#                 "--frontend cpp-backend")
#   transport     the protocol's batch-8 request (8 x (4,096 + 100) items, 0.5 MB) against a do-nothing model:
#                 each client transport's time a call, Triton's own, and the difference (client, transport
#                 and Triton's frontend: what no model can take off a protocol figure; bench/client_cost.py)
#   scale-out     `python -m bench.scale_out --workers 1,2,4,8`, 600 req/s each, against a do-nothing
#                 Python-backend model on the bundled tritonserver (INVALID rows: exit 1)
# (DEVICE=cpu bash bench/gpu_session.sh runs/x env:30 aoti-check:300: the CPU-runnable steps here)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?output folder}
shift
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
NATIVE=${NATIVE:---frontend python-backend}
WHEELS=${WHEELS:-.whl}
export PYTHONUNBUFFERED=1 WHEELS
mkdir -p "$OUT"
step_wheels() { bash bench/gpu_wheels.sh --install "$WHEELS"; }
step_env() {
    uname -a; nproc; free -g | head -2; nvidia-smi 2>&1 | head -15
    $PY -c "import sys, torch, numpy; print(sys.version, torch.__version__, torch.version.cuda, numpy.__version__)"
    $PY -m pip list 2>/dev/null | grep -i -E "^(torch|triton|numpy|nvidia-pytriton|tritonclient|locust|grpcio|protobuf|gevent) "
    gcc --version | head -1; which cuda-gdb nvcc cmake ninja
}
step_aoti_check() { $PY -m bench.gpu_aoti_check --out "$OUT/aoti-check"; }
step_protocol() { SERVE_ARGS="$NATIVE" bash bench/gpu_protocol.sh "$OUT/protocol" "${USERS:-128}" "${RUNS:-1}"; }
step_protocol_eager() {  # EAGER_CONFIGS: the configs (default: protocol's)
    HSTU_REPLAY_CUDA_GRAPHS=0 CONFIGS=${EAGER_CONFIGS:-${CONFIGS:-kuairand-1k kuairand-1k-8l}} SERVE_ARGS="$NATIVE" \
        bash bench/gpu_protocol.sh "$OUT/protocol-eager" "${USERS:-128}" 1
}
step_gpu_tests() {  # GPU_TESTS: the test files (default: all three)
    $PY -m pytest -q -s -p no:cacheprovider \
        ${GPU_TESTS:-tests/server/test_step_graphs.py tests/server/test_batched_step.py tests/server/test_cpp_backend.py} -k gpu
}
step_protocol_baot() {
    ENGINE=batched-aoti CONFIGS=${BAOT_CONFIGS:-kuairand-1k} SERVE_ARGS="$NATIVE" \
        bash bench/gpu_protocol.sh "$OUT/protocol-baot" "${USERS:-128}" 1
}
step_cpp_build() { $PY -c "from hstu_replay.server.cpp_backend import build_backend; print(build_backend())"; }
step_protocol_cpp() {
    ENGINE=batched-aoti CONFIGS=${CPP_CONFIGS:-kuairand-1k kuairand-1k-8l} \
        SERVE_ARGS="--frontend cpp-backend ${CPP_SERVE_ARGS:-}" \
        bash bench/gpu_protocol.sh "$OUT/protocol-cpp" "${USERS:-128}" "${RUNS:-1}"
}
step_protocol_cpp_graphs() {
    HSTU_REPLAY_CUDA_GRAPHS=1 ENGINE=batched-aoti CONFIGS=${CPP_CONFIGS:-kuairand-1k kuairand-1k-8l} \
        SERVE_ARGS="--frontend cpp-backend ${CPP_SERVE_ARGS:-}" REPOS="$OUT/protocol-cpp" bash bench/gpu_protocol.sh "$OUT/protocol-cpp-graphs" \
        "${USERS:-128}" "${RUNS:-1}"
}
step_package_source() {
    $PY -c "import pathlib, sys, zipfile
for package in sorted(pathlib.Path(sys.argv[1]).glob('repository-*/**/*.pt2')):
    config = next(p for p in package.parts if p.startswith('repository-'))[len('repository-'):]
    with zipfile.ZipFile(package) as archive:
        names = [n for n in archive.namelist() if n.endswith('.wrapper.cpp')]
        print(package, len(archive.namelist()), 'files;', names)
        for n in names:
            pathlib.Path(sys.argv[2], f'package-source-{config}.cpp').write_bytes(archive.read(n))" \
        "$OUT/protocol-cpp" "$OUT"
}
step_protocol_pyt() { CONFIGS=kuairand-1k bash bench/gpu_protocol.sh "$OUT/protocol-pyt" "${USERS:-128}" 1; }
step_protocol_aoti() {  # not where aoti-check (when run before) loaded no package compiled for the GPU
    [ ! -f "$OUT/aoti-check/aoti_check.json" ] ||
        $PY -c "import json,sys; r=json.load(open('$OUT/aoti-check/aoti_check.json')); sys.exit(not any(
            v.get('ok') and v['variant'].startswith('cuda') for v in r['variants']))" ||
        { echo "skipped: no GPU package loaded in aoti-check"; return 1; }
    ENGINE=aoti CONFIGS=kuairand-1k SERVE_ARGS="$NATIVE" bash bench/gpu_protocol.sh "$OUT/protocol-aoti" "${USERS:-128}" 1
}
profile_variants() {  # LABEL SERVE_OPTIONS...: the server with CUDA graphs, then without; phase lines from its log
    local label=$1 cfg=${PROFILE_CONFIG:-kuairand-1k} H G M C server variant
    shift
    for variant in graphs eager; do
        export HSTU_REPLAY_CUDA_GRAPHS=$( [ $variant = graphs ] && echo 1 || echo 0 )
        export HSTU_REPLAY_BACKEND_PHASES=4  # the warm-up's 4 calls, then cold and cached calls apart
        read -r H G M C < <($PY -c "from hstu_replay.process import free_ports; print(*free_ports(4))")
        $PY -m hstu_replay.cli server serve --config "$cfg" --dtype "${DTYPE:-bfloat16}" --device "$DEVICE" "$@" \
            --http-port "$H" --grpc-port "$G" --metrics-port "$M" --cache-metrics-port "$C" \
            >"$OUT/$label-$variant.log" 2>&1 &
        server=$!
        $PY -m hstu_replay.cli server wait --http-port "$H" --pid $server --log "$OUT/$label-$variant.log" \
            --timeout 240 && echo "== $label, CUDA graphs $variant" &&
            $PY -m bench.gpu_serving_profile --grpc-port "$G" --http-port "$H" --config "$cfg" --device "$DEVICE" \
                --dtype "${DTYPE:-bfloat16}" --history "${HISTORY:-4096}" --candidates "${CANDIDATES:-100}" \
                --calls "${CALLS:-12}" --out "$OUT/$label-$variant"
        kill -INT $server; wait $server
        grep -E "^phases|CUDA graphs off" "$OUT/$label-$variant.log"
    done
}
export -f profile_variants
step_profile() { profile_variants profile --engine batched $NATIVE; }
step_profile_cpp() {
    profile_variants profile-cpp --engine batched-aoti --frontend cpp-backend \
        --repository "$OUT/protocol-cpp/repository-${PROFILE_CONFIG:-kuairand-1k}"
}
step_attention_tune() {
    local repo=$OUT/protocol-cpp/repository-${PROFILE_CONFIG:-kuairand-1k}
    $PY -m bench.gpu_attention_tune --out "$OUT/attention-tune" --config "${PROFILE_CONFIG:-kuairand-1k}" \
        --package "$repo" ${TUNE_ARGS:-}
}
step_locust() { SERVE_ARGS="$NATIVE" bash bench/gpu_locust.sh "$OUT/locust"; }
step_locust_cpp() {
    ENGINE=batched-aoti SERVE_ARGS="--frontend cpp-backend --repository $OUT/protocol-cpp/repository-kuairand-1k" \
        bash bench/gpu_locust.sh "$OUT/locust-cpp"
}
step_flow() {  # reuses the repository protocol-aoti compiled, where there is one
    local from=$OUT/protocol-aoti/repository-kuairand-1k
    $PY -m hstu_replay.cli flow l0 --out "$OUT/flow" --config "${FLOW_CONFIG:-kuairand-1k}" --device "$DEVICE" \
        $( [ -f "$from/hstu_target.json" ] && echo --export-from "$from" ) ${FLOW_ARGS:-}
}
step_transport() { $PY -m bench.client_cost --skip cpu,floor,rate --shapes 4096 --seconds 8 --rounds 1; }
step_scale_out() {
    $PY -m bench.scale_out --workers "${WORKERS:-1,2,4,8}" --instances "${INSTANCES:-16}" \
        --rate-per-worker "${RATE_PER_WORKER:-600}" --seconds 10
    mkdir -p "$OUT/scale-out" && cp runs/scale-out/*.log "$OUT/scale-out/" 2>/dev/null
}
for spec in "$@"; do
    name=${spec%%:*} limit=${spec#*:}
    fn=step_${name//-/_}
    if ! declare -F "$fn" >/dev/null; then echo "unknown step $name" >&2; exit 2; fi
    started=$(date +%s)
    echo "=== $name (limit ${limit} s) at $(date -u +%T)"
    export -f "$fn"
    export OUT PY DEVICE NATIVE
    timeout -k 15 "$limit" bash -c "$fn" 2>&1 | tee "$OUT/$name.log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s"
done
# what comes back: logs, reports and JSON, not the data sets, stores or compiled repositories
tar czf "$OUT/results.tgz" -C "$OUT" --exclude=raw --exclude=store --exclude='repository-*' --exclude='*.pt2' \
    --exclude=dump --exclude=data --exclude=model_repository --exclude='*.jsonl' $(cd "$OUT" && ls | grep -v results.tgz)
