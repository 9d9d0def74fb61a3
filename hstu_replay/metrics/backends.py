"""Per-server figures from each backend's own metrics, for a load test that sees only a gateway.

Behind a gateway the load generator cannot tell which server answered a request; each server can.
`BackendMetrics.snapshot()` scrapes every backend's KV-cache counters (and Triton's metrics where
the backend names their URL) through `metrics.pages`; `figures(before, after)` gives, per
server, what it counted between the two: requests, hit and computed tokens, their hit ratio, and
Triton's `nv_inference_request_success` of the model. Take a snapshot when a stage's window opens
and another when it closes. A server that could not be scraped (lost, or restarted: its counters
went down) has None for what is unknown.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hstu_replay.metrics.pages import Scrape, cache_delta, triton_delta, try_scrape
from hstu_replay.fleet.local import Backend
from hstu_replay.interface import KVCACHE


@dataclass(frozen=True)
class ServerScrape:
    """One server's pages at one moment (None: not scraped)."""

    cache: Scrape | None
    triton: Scrape | None


@dataclass(frozen=True)
class Snapshot:
    """Every server's pages at one moment, in the fleet's order."""

    servers: tuple[ServerScrape, ...]


@dataclass(frozen=True)
class ServerFigures:
    """What one server counted between two snapshots."""

    server: int  # its index in the fleet
    requests: int | None
    hit_tokens: int | None
    computed_tokens: int | None
    hit_ratio: float | None  # hit tokens over all history tokens; None without tokens
    request_success: int | None  # Triton's successful requests of the model (None without its metrics URL)


class BackendMetrics:
    """The metrics of `backends` (their `cache_metrics_url` and `metrics_url`), for `model`."""

    def __init__(self, backends: Sequence[Backend], model: str = KVCACHE.model_name):
        self.backends, self.model = tuple(backends), model

    def snapshot(self) -> Snapshot:
        """Every page scraped at once (one slow server does not delay the others' moment)."""
        urls = [url for b in self.backends for url in (b.cache_metrics_url, b.metrics_url)]
        with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
            pages = list(pool.map(try_scrape, urls))
        return Snapshot(tuple(ServerScrape(pages[2 * i], pages[2 * i + 1]) for i in range(len(self.backends))))

    def figures(self, before: Snapshot, after: Snapshot) -> tuple[ServerFigures, ...]:
        return tuple(self._server(i, b, a) for i, (b, a) in enumerate(zip(before.servers, after.servers)))

    def _server(self, index: int, before: ServerScrape, after: ServerScrape) -> ServerFigures:
        cache = (cache_delta(before.cache, after.cache)
                 if before.cache is not None and after.cache is not None else {})
        triton = (triton_delta(before.triton, after.triton, self.model)
                  if before.triton is not None and after.triton is not None else {})
        return ServerFigures(index, cache.get("requests"), cache.get("hit_tokens"), cache.get("computed_tokens"),
                             cache.get("token_hit_ratio"), triton.get("request_success"))
