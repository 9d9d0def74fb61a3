"""What TLS costs the load generator: our transports over TLS against the same transports in the clear, in one run.

    python -m bench.tls_cost                   # about 2 minutes
    python -m bench.tls_cost --seconds 5 --rounds 1

Two do-nothing PyTriton models with the KV-cache interface run in child processes: one in the
clear, one with gRPC over TLS (tritonserver's own) and HTTPS through the target's TLS-terminating
forwarder in front of its HTTP port (certificates from a private CA made here with openssl).
For each protocol, our transport (`TritonClient.infer`, as a Locust user sends) runs alone in a
gevent-patched child process, one request in flight over the same requests (8 users x (2,048 + 16),
half a megabyte each), first in the clear and then through TLS, `--rounds` times in turn; CPU from
getrusage. The figure is the ratio of client CPU per request, TLS over clear, per round: the
reference run is the same transport in the same invocation. With HTTPS the forwarder's own
work happens in the server's process, not the client's; its latency shows in req/s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from bench import harness
from bench.client_cost import TRANSPORT_LOOP
from bench.harness import ROOT, Shape
from hstu_replay.interface import KVCACHE
from hstu_replay.process import free_ports
from tests.certs import make_certs

OUT = ROOT / "runs" / "tls-cost"
SHAPE = Shape(8, 2048, 16)


def loop(protocol: str, url: str, options: dict, seconds: float) -> tuple[float, float]:
    """req/s and client CPU ms per request of our transport, one request in flight."""
    code = TRANSPORT_LOOP.format(protocol=protocol, url=url, which="ours", options=options,
                                 seconds=seconds, shape=(SHAPE.batch, SHAPE.history, SHAPE.candidates),
                                 dumps=str(OUT / "dumps"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if done.returncode:
        raise SystemExit(f"transport loop failed: {done.stderr.strip()[-300:]}")
    n, elapsed, cpu, _ = done.stdout.split()
    return int(n) / float(elapsed), 1e3 * float(cpu) / int(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="loop per reading (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="readings of each variant, in turn (default 2)")
    parser.add_argument("--protocols", default="http,grpc")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    certs = make_certs(OUT / "certs")
    harness.shape_dumps(SHAPE, OUT / "dumps")
    (https,) = free_ports(1)
    load_before = harness.machine_load()
    clear = harness.start_null(KVCACHE, OUT / "clear.log")
    secure = harness.start_null(KVCACHE, OUT / "tls.log", extra=["--tls-cert", str(certs.cert), "--tls-key",
                                                                str(certs.key), "--https-port", str(https)])
    tls_options = {"ssl": True, "root_certificates": str(certs.ca)}
    rows = []
    try:
        for protocol in args.protocols.split(","):
            readings = {"clear": [], "tls": []}
            for _ in range(args.rounds):
                readings["clear"].append(loop(protocol, clear.url_for(protocol), {}, args.seconds))
                secure_url = secure.url if protocol == "grpc" else f"127.0.0.1:{https}"
                readings["tls"].append(loop(protocol, secure_url, tls_options, args.seconds))
            ratios = [t[1] / c[1] for c, t in zip(readings["clear"], readings["tls"])]
            for name, values in readings.items():
                rows.append([protocol, name, statistics.median(v[0] for v in values),
                             statistics.median(v[1] for v in values),
                             "" if name == "clear" else " ".join(f"{r:.2f}x" for r in ratios)])
    finally:
        clear.stop()
        secure.stop()
    print(f"\nOur transports, {SHAPE.name} requests, one in flight (median over {args.rounds} rounds):\n")
    print(harness.table(["protocol", "connection", "req/s", "client CPU ms/request", "TLS / clear, per round"], rows))
    print(f"\ncommand: {harness.this_command()}\nload average before: {load_before}, after: {harness.machine_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
