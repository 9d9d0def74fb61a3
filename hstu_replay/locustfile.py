"""hstu-replay's Locust entry: `locust -f locustfiles/hstu.py` (web UI) or add `--headless`.

From an installed package, the same file:
`locust -f "$(python -c 'import hstu_replay; print(hstu_replay.LOCUSTFILE)')"`.
Options: `hstu-replay options` lists every one, its default, its environment variable and how the
web form treats it, by group; README.md has the same table. Locust answers `--help` before it
loads a locustfile, so `locust -f ... --help` shows Locust's own options only and nothing here can
add to it; a log line at each start names the listing instead.
"""

import logging
import os

# gRPC's own INFO lines (a failed TLS handshake, say) would only repeat the one error line; set
# GRPC_VERBOSITY to see them.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from grpc.experimental import gevent as grpc_gevent  # noqa: E402

grpc_gevent.init_gevent()  # before any gRPC channel exists: otherwise gRPC blocks gevent's loop

from hstu_replay.client.heap import keep_freed_memory  # noqa: E402

keep_freed_memory()  # request buffers are reused, not faulted in anew for each request

from locust import events  # noqa: E402

#: logged at each start, before the options are read (Locust's --help cannot show ours)
OPTIONS_HINT = "hstu-replay: this locustfile's options, defaults and environment variables: hstu-replay options"


@events.init.add_listener
def _name_the_listing(**_):
    logging.getLogger(__name__).info(OPTIONS_HINT)


from hstu_replay.loadtest import hooks  # noqa: E402,F401 - registers the options and listeners
from hstu_replay.loadtest.shape import SweepShape  # noqa: E402,F401
from hstu_replay.loadtest.user import HstuUser  # noqa: E402,F401
