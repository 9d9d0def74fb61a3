"""A Prometheus text page read the plainest way, independently of prometheus_client: every sample
line `name value` (no labels: the target's cache-metrics page has none) -> its value."""

from __future__ import annotations


def exposed(text: str) -> dict[str, float]:
    samples = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, value in samples}
