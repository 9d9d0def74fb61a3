"""What routing over a fleet costs a Locust worker, beside the same worker against one address, in one run.

    unshare -n sh -c 'ip link set lo up && python -m bench.fleet_cost'      # 64 addresses (a namespace of its own)
    python -m bench.fleet_cost --addresses 2 --namespace-free                 # two null servers, no namespace

A do-nothing model (bench.null_model) serves the KV-cache interface, so server compute hides
nothing. Inside a network namespace of loopback alone (unshare -n) it listens on every address
of that namespace, so 127.0.0.1 ... 127.0.0.N are N addresses of one server: the worker routes
over N (its ring, N cache models, a client per server reached) while the server counts every
request. Without the namespace (`--namespace-free`) N null servers are started, one per address,
and their counts summed. The product path: `locust -f locustfiles/hstu.py`, sessions at hit
ratio 0.5, batch 8, `--users` users; rounds alternate one address and N (`--routings` each), so
drift on a shared machine hits every reading alike. Each reading is a steady window
(harness.measure): worker CPU ms per request the server counted, and the worker's resident
memory at the window's end. Prints a markdown table, the command and the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench import harness
from bench.harness import ROOT
from hstu_replay.interface import KVCACHE

OUT = ROOT / "runs" / "fleet-cost"
MODEL = KVCACHE.model_name


class Servers:
    """The null servers behind the addresses: one listening on the namespace's whole loopback, or one
    per address; `successes` sums what they answered."""

    def __init__(self, count: int, shared: bool):
        binds = ("--bind", "0.0.0.0") if shared else ()
        self.started = [harness.start_null(KVCACHE, OUT / f"server{i}.log", extra=binds)
                        for i in range(1 if shared else count)]
        port = self.started[0].ports.grpc
        self.addresses = ([f"127.0.0.{i + 1}:{port}" for i in range(count)] if shared
                          else [s.grpc_url for s in self.started])

    def stop(self) -> None:
        for s in self.started:
            s.stop()


def reading(servers: Servers, hosts: list[str], routing: str, args, store) -> harness.Window:
    command = harness.workload_command(
        ",".join(hosts), "grpc", ["--workload", "sessions", "--store", str(store), "--hit-ratios", "0.5",
                                  "--max-history", "512"], OUT / "report", args.seconds + 20, "--verify-fraction", "0",
        "--routing", routing, users=args.users)
    return harness.measure(command, servers.started, MODEL, OUT / "client.log", args.seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addresses", type=int, default=64, help="addresses of the fleet (default 64)")
    parser.add_argument("--routings", default="key-hash,round-robin", help="of key-hash, round-robin, random")
    parser.add_argument("--users", type=int, default=8, help="virtual users (default 8)")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady window per reading (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="readings of each case, in turn (default 3)")
    parser.add_argument("--namespace-free", action="store_true", help="one null server per address, no namespace")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    store = harness.synthetic_store(OUT / "store", users=200)
    load_before = harness.machine_load()
    servers = Servers(args.addresses, shared=not args.namespace_free)
    cases = [("one address", servers.addresses[:1], "key-hash")]
    cases += [(f"{args.addresses} addresses, {r}", servers.addresses, r) for r in args.routings.split(",")]
    windows: dict[str, list[harness.Window]] = {name: [] for name, _, _ in cases}
    try:
        for r in range(args.rounds):
            for name, hosts, routing in cases:
                w = reading(servers, hosts, routing, args, store)
                windows[name].append(w)
                print(f"  round {r + 1}: {name:32s} {w.cpu_ms:.3f} CPU ms/request ({w.rps:,.0f} req/s), "
                      f"RSS {w.rss_mib:.1f} MiB (load {harness.machine_load()})", flush=True)
    finally:
        servers.stop()
    base = windows[cases[0][0]]
    rows = []
    for name, _, _ in cases:
        group = windows[name]
        ratios = [w.cpu_ms / b.cpu_ms for w, b in zip(group, base)]
        rows.append([name, statistics.median(w.rps for w in group), statistics.median(w.cpu_ms for w in group),
                     f"{statistics.median(ratios):.3f}x ({', '.join(f'{x:.3f}' for x in ratios)})",
                     statistics.median(w.rss_mib for w in group),
                     statistics.median(w.rss_mib - b.rss_mib for w, b in zip(group, base))])
    print()
    print(harness.table(["case", "req/s", "worker CPU ms/request", "to one address (per round)", "worker RSS MiB",
                         "RSS - one address MiB"], rows))
    print(f"\ncommand: {harness.this_command()}")
    print(f"load average before: {load_before}; after: {harness.machine_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
