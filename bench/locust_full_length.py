"""Locust entry for bench/loadgen_bench.py: locustfiles/hstu.py, but every request is full-length.

Session replay cannot hold requests at 8 x (4096 history + 100 candidates): its lengths follow
the users' visits. This keeps all of hstu.py (options, HstuUser, accounting, records, reports)
and only swaps the `sessions` source for loadgen_bench.FullLengthSource (run with --hit-ratios 0).
"""

import sys
from pathlib import Path

from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()  # before any gRPC channel exists, as in locustfiles/hstu.py

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadgen_bench import FullLengthSource  # noqa: E402

from hstu_replay.loadtest import hooks  # noqa: E402,F401 - registers the options and listeners
from hstu_replay.loadtest import user as user_module  # noqa: E402
from hstu_replay.loadtest.shape import SweepShape  # noqa: E402,F401
from hstu_replay.loadtest.user import HstuUser  # noqa: E402,F401


def _full_length(runtime, index: int) -> FullLengthSource:
    config = runtime.config
    return FullLengthSource(runtime.store, runtime.keys_for(index), config.candidates, config.limits)


user_module.SOURCES["sessions"] = _full_length
