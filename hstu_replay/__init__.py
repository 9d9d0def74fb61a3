"""hstu-replay: replay KuaiRand-1K traffic against HSTU ranking models served by Triton."""

from pathlib import Path

__version__ = "0.1.0"

# The Locust entry inside the package (`locust -f` on it works from a wheel as from a checkout).
LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")
