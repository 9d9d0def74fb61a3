"""Locust entry for bench/loadgen_bench.py: locustfiles/hstu.py, but every request is full-length.

Session replay cannot hold requests at 8 x (4096 history + 100 candidates): its lengths follow
the users' visits. This keeps all of hstu.py (options, HstuUser, accounting, records, reports)
and only swaps the `sessions` workload's source for loadgen_bench.FullLengthSource (run with --hit-ratios 0).
"""

import sys
from pathlib import Path

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any gRPC channel exists, as in locustfiles/hstu.py

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen_bench import FullLengthSource  # noqa: E402

from hstu_replay.loadtest import hooks  # noqa: E402,F401 - registers the options and listeners
from hstu_replay.loadtest.shape import SweepShape  # noqa: E402,F401
from hstu_replay.loadtest.user import HstuUser  # noqa: E402,F401
from hstu_replay.plan import workloads  # noqa: E402


class FullLengthWorkload(workloads.SessionWorkload):
    """The sessions workload's store and checks, with full-length steps."""

    def source(self, keys) -> FullLengthSource:
        o = self.options
        return FullLengthSource(self.store, keys, o.candidates, o.limits)


workloads.WORKLOADS["sessions"] = FullLengthWorkload
