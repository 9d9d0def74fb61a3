"""hstu-replay's Locust entry from a checkout: `locust -f locustfiles/hstu.py` (web UI) or add `--headless`.

The code lives in the package (`hstu_replay/locustfile.py`, path in `hstu_replay.LOCUSTFILE`), so
an installed wheel runs the same file; this one only re-exports what Locust looks for. Its options:
`hstu-replay options` (`locust -f locustfiles/hstu.py --help` shows Locust's own only).
"""

from hstu_replay.locustfile import HstuUser, SweepShape  # noqa: F401
