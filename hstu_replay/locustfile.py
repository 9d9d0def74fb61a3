"""hstu-replay's Locust entry: `locust -f locustfiles/hstu.py` (web UI) or add `--headless`.

From an installed package, the same file:
`locust -f "$(python -c 'import hstu_replay; print(hstu_replay.LOCUSTFILE)')"`.
Options: `hstu-replay options` lists every one, its default and its environment variable, by group
(Locust reads `--help` before it loads a locustfile, so `locust -f ... --help` shows Locust's own
only); README.md has the same table.
"""

import os

# gRPC's own INFO lines (a failed TLS handshake, say) would only repeat the one error line; set
# GRPC_VERBOSITY to see them.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from grpc.experimental import gevent as grpc_gevent  # noqa: E402

grpc_gevent.init_gevent()  # before any gRPC channel exists: otherwise gRPC blocks gevent's loop

from hstu_replay.client.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()  # request buffers are reused, not faulted in anew for each request

from hstu_replay.loadtest import hooks  # noqa: E402,F401 - registers the options and listeners
from hstu_replay.loadtest.shape import SweepShape  # noqa: E402,F401
from hstu_replay.loadtest.user import HstuUser  # noqa: E402,F401
