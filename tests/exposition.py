"""A Prometheus text page read the plainest way, independently of prometheus_client: every sample
line `name value` -> its value (the target's cache-metrics page has labels on one line only, its server's
addresses, which stay in the name as written)."""

from __future__ import annotations


def exposed(text: str) -> dict[str, float]:
    samples = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}
