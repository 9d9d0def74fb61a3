"""Where one served request's time goes: the client and gRPC, Triton, the backend stub, our engine.

    python -m bench.gpu_serving_profile --grpc-port G --http-port H --config kuairand-1k --device cuda

Against a running `server serve` (either frontend; same --config, --dtype and seed): 8 synthetic
users with full-length histories (--history items, --candidates each), sent to the KV-cache model
one call at a time over gRPC (tritonclient): --calls calls on fresh keys (nothing cached), then
--calls on keys primed once (all cached). For each case: the client's p50, and Triton's own mean
per request over exactly those calls (success = the whole request on the server, compute_infer =
the backend's execute). Then, in this process, the same requests through a batched engine of the
same model: `serve.infer_outputs` (input tensors -> RequestTensors -> engine -> output tensors) and
`engine.infer` alone, p50 after the same warm-up. The differences place the time:
client p50 - success: client, gRPC and the network stack; success - compute_infer: Triton's core;
compute_infer - infer_outputs: the backend (the stub's IPC and shared memory, for PyTriton its
proxy too); infer_outputs - engine.infer: reading the tensors into users. Where the engine takes
CUDA graphs (`step_graphs`), the cached requests also run with them off: both times and the
largest difference of their logits.
Prints one line per case and a JSON object (also under --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.gpu_triton_stats import per_request_ms, snapshot
from hstu_replay.interface import KVCACHE, Limits
from hstu_replay.request import UserRequest, build_request

BATCH = 8


def make_users(first_key: int, history: int, candidates: int, seed: int) -> list[UserRequest]:
    rng = np.random.default_rng(seed)
    return [UserRequest(1000 + i, tuple(int(x) for x in rng.integers(1, 5, 5)), rng.integers(1, 10**7, history),
                        rng.integers(0, 256, history), rng.integers(1, 10**7, candidates), first_key + i)
            for i in range(BATCH)]


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array in arrays.items():
        item = grpcclient.InferInput(name, list(array.shape), "INT64")
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def served(client, http_port: int, requests: list[dict[str, np.ndarray]]) -> dict:
    import tritonclient.grpc as grpcclient

    outputs = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT__0", "CACHED_TOKENS")]
    before = snapshot(http_port)
    times, hits = [], []
    for arrays in requests:
        inputs = grpc_inputs(arrays)
        started = time.perf_counter()
        result = client.infer(KVCACHE.model_name, inputs, outputs=outputs)
        times.append(1e3 * (time.perf_counter() - started))
        hits.append(int(result.as_numpy("CACHED_TOKENS").sum()))
    stats = per_request_ms(before, snapshot(http_port)).get(KVCACHE.model_name, {})
    return {"client_p50_ms": round(statistics.median(times), 3), "server_success_ms": stats.get("success"),
            "server_compute_infer_ms": stats.get("compute_infer"), "server_queue_ms": stats.get("queue"),
            "server_compute_input_ms": stats.get("compute_input"),
            "server_compute_output_ms": stats.get("compute_output"), "cached_tokens": hits[-1]}


def in_process(args, cold: list[dict], warm: list[dict]) -> dict:
    import torch

    from hstu_replay.request import RequestTensors
    from hstu_replay.server.batched import build_batched_engine
    from hstu_replay.server.model_config import get_config
    from hstu_replay.server.model import build_model
    from hstu_replay.server.serve import infer_outputs

    config = get_config(args.config, args.dtype)
    engine = build_batched_engine(build_model(config, args.seed).to(args.device), 4 * BATCH * 8200 * 2, 32)

    def timed(function, requests) -> float:
        times = []
        for arrays in requests:
            started = time.perf_counter()
            function(arrays)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - started))
        return round(statistics.median(times), 3)

    out = {}
    for case, requests in (("cold", cold), ("cached", warm)):
        def whole(arrays):
            return infer_outputs(engine, arrays, KVCACHE, True)


        if case == "cached":
            for arrays in requests[:1]:
                whole(arrays)  # prime this engine's cache with the same keys
        out[case] = {"infer_outputs_p50_ms": timed(whole, requests)}
        prebuilt = {id(a): RequestTensors.from_inputs(a, KVCACHE) for a in requests}
        if case == "cold":  # fresh keys again, so the engine computes everything
            engine.clear_cache()
        out[case]["engine_infer_p50_ms"] = timed(lambda a: engine.infer(prebuilt[id(a)]), requests)
        if case == "cached" and engine.graphs is not None:  # the same with the graphs off; both answers
            first = prebuilt[id(requests[0])]
            graphed = engine.infer(first).logits
            graphs, engine.graphs = engine.graphs, None
            out[case]["engine_infer_eager_p50_ms"] = timed(lambda a: engine.infer(prebuilt[id(a)]), requests)
            eager = engine.infer(first).logits
            engine.graphs = graphs
            out[case]["graphs_vs_eager_max_abs_diff"] = float(np.abs(graphed - eager).max())
            out[case]["logits_max_abs"] = float(np.abs(eager).max())
        if case == "cold":
            engine.clear_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--config", default="kuairand-1k")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0, help="the server's weights seed (default 0)")
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", help="write profile.json here")
    args = parser.parse_args()
    import tritonclient.grpc as grpcclient

    def request(users) -> dict[str, np.ndarray]:
        return build_request(users, Limits(max_values=70_000)).inputs(KVCACHE)

    cold = [request(make_users(7_000_000 + 100 * i, args.history, args.candidates, i)) for i in range(args.calls + 2)]
    warm_users = make_users(8_000_000, args.history, args.candidates, 99)
    warm = [request(warm_users) for _ in range(args.calls + 2)]
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{args.grpc_port}")
    try:
        served(client, args.http_port, cold[:2] + warm[:2])  # warm-up; primes the cached keys
        report = {"served": {"cold": served(client, args.http_port, cold[2:]),
                             "cached": served(client, args.http_port, warm[2:])}}
    finally:
        client.close()
    report["in_process"] = in_process(args, cold[2:], warm[1:])
    for case in ("cold", "cached"):
        s, p = report["served"][case], report["in_process"][case]
        print(f"{case}: client p50 {s['client_p50_ms']} ms; server success {s['server_success_ms']} ms, "
              f"compute_infer {s['server_compute_infer_ms']} ms; in process infer_outputs "
              f"{p['infer_outputs_p50_ms']} ms, engine.infer {p['engine_infer_p50_ms']} ms "
              f"(batch {BATCH}, cached tokens of the last call {s['cached_tokens']})", flush=True)
    cached = report["in_process"]["cached"]
    if "engine_infer_eager_p50_ms" in cached:
        print(f"cached, in process: engine.infer {cached['engine_infer_p50_ms']} ms with CUDA graphs, "
              f"{cached['engine_infer_eager_p50_ms']} ms without; logits max |diff| "
              f"{cached['graphs_vs_eager_max_abs_diff']:.3g} (largest |logit| {cached['logits_max_abs']:.3g})",
              flush=True)
    print(json.dumps(report), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "profile.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
