"""A do-nothing model server: zeros of the right shape (started by harness.start_null).

    python -m bench.null_model MODEL_NAME GRPC HTTP METRICS [--instances N]   # serve until SIGTERM
        [--tls-cert PEM --tls-key PEM [--https-port P]]   # gRPC over TLS; HTTPS in front of HTTP
        [--frontend python-backend]   # no PyTriton: the bundled tritonserver, the model in its Python backend

PyTriton (the default) answers from this process behind one more shared-memory hop; with
`--frontend python-backend` each of the `--instances` backend stubs answers by itself
(bench/null_backend.py), as `server serve --frontend python-backend` serves the target.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hstu_replay.interface import INTERFACES, NUM_TASKS, ModelInterface

READY = "null-model: ready"
ROOT = Path(__file__).resolve().parents[1]
BY_MODEL = {i.model_name: i for i in INTERFACES.values()}


def zeros(interface: ModelInterface) -> Callable[[list], list[dict[str, np.ndarray]]]:
    """Infer function: sum(num_candidates) rows of 8 zero logits, and one zero per user in each INT64 output."""
    counts = interface.field_to_input["num_candidates"]

    def infer(requests: list) -> list[dict[str, np.ndarray]]:
        out = []
        for request in requests:
            candidates = np.asarray(request[counts])
            answer = {t.name: np.zeros(len(candidates), dtype=np.int64)
                      for t in interface.outputs if t.dtype == "INT64"}
            answer[interface.logits_output] = np.zeros((int(candidates.sum()), NUM_TASKS), dtype=np.float32)
            out.append(answer)
        return out

    return infer


def serve(interface: ModelInterface, grpc_port: int, http_port: int, metrics_port: int, instances: int = 1,
          tls=None, https_port: int = 0, bind: str = "127.0.0.1") -> None:
    """Host `interface`'s model (`instances` copies) answering zeros until SIGTERM; statistics stay open.
    With `tls` (TlsFiles) gRPC takes TLS only, and `https_port` serves HTTPS as the target does."""
    from hstu_replay.server.serve import PROTECTED_ENDPOINTS, python_backend_env
    from hstu_replay.server.tls_proxy import TlsForwarder

    python_backend_env()
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    dtypes = {"INT64": np.int64, "FP32": np.float32}
    config = TritonConfig(http_address=bind, http_port=http_port, grpc_address=bind,
                          grpc_port=grpc_port, metrics_address=bind, metrics_port=metrics_port,
                          exit_on_error=True, grpc_use_ssl=tls is not None or None,
                          grpc_server_cert=tls and tls.cert, grpc_server_key=tls and tls.key)
    https = TlsForwarder("127.0.0.1", https_port, ("127.0.0.1", http_port), tls) if https_port else None
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=PROTECTED_ENDPOINTS)) as triton:
        triton.bind(interface.model_name, [zeros(interface) for _ in range(instances)],
                    inputs=[Tensor(name=t.name, dtype=dtypes[t.dtype], shape=t.dims) for t in interface.inputs],
                    outputs=[Tensor(name=t.name, dtype=dtypes[t.dtype], shape=t.dims) for t in interface.outputs],
                    config=ModelConfig(batching=False))
        triton.run()
        print(READY, flush=True)
        while not stop.wait(0.5):
            if not triton.is_alive():
                raise SystemExit("tritonserver exited unexpectedly")
    if https is not None:
        https.close()


def serve_backend(interface: ModelInterface, grpc_port: int, http_port: int, metrics_port: int,
                  instances: int = 1) -> None:
    """Host `interface`'s model on the bundled tritonserver directly, `instances` Python-backend
    stubs answering zeros, until SIGTERM; statistics stay open."""
    from hstu_replay.server.python_backend import (
        ModelEntry, config_text, import_paths, model_file, prepare_backend, stop_tritonserver, tritonserver,
    )
    from hstu_replay.server.serve import ServeOptions, run_until_stopped

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workspace = Path(tempfile.mkdtemp(prefix="null-model-"))
    server = None
    try:
        binary, backends, libs = prepare_backend(workspace)
        folder = workspace / "models" / interface.model_name
        (folder / "1").mkdir(parents=True)
        entry = ModelEntry("null", interface.model_name, interface.inputs, interface.outputs)
        (folder / "config.pbtxt").write_text(config_text(entry, None, instances))
        (folder / "1" / "model.py").write_text(model_file([str(ROOT), *import_paths()], "bench.null_backend"))
        options = ServeOptions(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
        server = tritonserver(binary, backends, workspace / "models", options, libs)
        server.start()
        print(READY, flush=True)
        run_until_stopped(lambda: server.running, stop)
    finally:
        if server is not None:
            stop_tritonserver(server)
        shutil.rmtree(workspace, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=sorted(BY_MODEL), metavar="MODEL_NAME", help=", ".join(sorted(BY_MODEL)))
    for port in ("grpc", "http", "metrics"):
        parser.add_argument(port, type=int, help=f"{port} port")
    parser.add_argument("--instances", type=int, default=1, help="model instances (default 1)")
    parser.add_argument("--tls-cert", help="PEM server certificate: gRPC over TLS")
    parser.add_argument("--tls-key", help="its PEM private key")
    parser.add_argument("--https-port", type=int, default=0, help="HTTPS in front of the HTTP port (needs --tls-cert)")
    parser.add_argument("--bind", default="127.0.0.1", help="the address listened on (default 127.0.0.1; 0.0.0.0 "
                        "only inside a network namespace of loopback alone, as bench.fleet_cost runs it)")
    parser.add_argument("--frontend", choices=("pytriton", "python-backend"), default="pytriton",
                        help="pytriton (default) or python-backend: the bundled tritonserver alone, no TLS")
    args = parser.parse_args()
    if args.frontend == "python-backend":
        if args.tls_cert or args.https_port:
            raise SystemExit("null-model: --frontend python-backend serves no TLS")
        serve_backend(BY_MODEL[args.model], args.grpc, args.http, args.metrics, args.instances)
        return 0
    from hstu_replay.server.tls_proxy import TlsFiles

    tls = TlsFiles(args.tls_cert, args.tls_key) if args.tls_cert else None
    serve(BY_MODEL[args.model], args.grpc, args.http, args.metrics, args.instances, tls, args.https_port, args.bind)
    return 0


if __name__ == "__main__":
    sys.exit(main())
