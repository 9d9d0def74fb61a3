"""The servers of a run as one process sees them: each server's cache model and availability, and
the router that picks a request's server (`--host` with several addresses, `--routing`).

Under `key-hash` each virtual user has a home server (virtual users dealt round the fleet in
turn, across workers alike), draws only keys the hash sends there and plans its steps with the
model of that server, so the target ratio holds on every server. Under a balancer
(`round-robin`, `random`) the plan is made as affinity would have it, with a model of one server's
pool (`plan_cache`), and each request's prediction comes from the model of the server it really
reaches: what the balancer does to the hit ratio is predicted, and the servers say what they saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hstu_replay.fleet.routing import router
from hstu_replay.loadtest.config import LoadTestConfig
from hstu_replay.plan.cache_model import CacheModel
from hstu_replay.plan.keys import KeyAllocator, Landing
from hstu_replay.plan.tiers import TierHits
from hstu_replay.request import RequestTensors
from hstu_replay.stats.availability import Availability
from hstu_replay.stats.run_stats import RunStats


@dataclass
class Server:
    index: int  # in the fleet's order; its figures' key (-1 for the only server: no per-server figures)
    address: str
    cache: CacheModel  # the client's model of its KV cache (this process's share of its pools)
    availability: Availability


class Fleet:
    def __init__(self, config: LoadTestConfig, workers: int, stats: RunStats, say: Callable[[str], None]):
        target, cache = config.target, config.cache
        addresses = target.addresses
        workers = max(workers, 1)

        def model(budget: int) -> CacheModel:  # the process's share: keys are disjoint across workers
            return CacheModel(None if budget <= 0 else budget // workers, cache.page_tokens,
                              cache.host_budget_tokens // workers, cache.offload_mode, cache.offload_chunk_tokens)

        budgets = cache.gpu_budgets(len(addresses))
        many = len(addresses) > 1
        self.servers = [Server(i if many else -1, a, model(b),
                               Availability(stats, say, i if many else -1, a if many else "the server"))
                        for i, (a, b) in enumerate(zip(addresses, budgets))]
        self.router = router(target.routing, addresses, config.data.seed)
        affinity = target.routing.keeps_affinity or not many
        self.plan_cache = None if affinity else model(max(budgets))
        self._visited: dict[int, int] = {}  # a fleet's key -> the servers it was sent to (bit i: server i)

    @property
    def many(self) -> bool:
        return len(self.servers) > 1

    def home(self, worker_index: int, user_index: int, workers: int) -> int | None:
        """Under `key-hash`, the server of a virtual user's keys; None where keys are not placed."""
        if self.plan_cache is not None or not self.many:
            return None
        return (user_index * max(workers, 1) + worker_index) % len(self.servers)

    def keys(self, worker_index: int, user_index: int, workers: int) -> KeyAllocator:
        """A virtual user's key allocator: its keys land on its home server, where it has one."""
        home = self.home(worker_index, user_index, workers)
        return KeyAllocator(worker_index, user_index, landing=None if home is None else Landing(self.router.servers,
                                                                                                  home))

    def planning_cache(self, worker_index: int, user_index: int, workers: int) -> CacheModel:
        """The model a virtual user's steps are planned with: its home server's, under `key-hash`."""
        if self.plan_cache is not None:
            return self.plan_cache
        return self.servers[self.home(worker_index, user_index, workers) or 0].cache

    def route(self, request: RequestTensors) -> Server:
        """The server `request` goes to, by its first user's cache key."""
        if not self.many:
            return self.servers[0]
        return self.servers[self.router.server(int(request.user_ids[0]))]

    @property
    def epoch(self) -> int:
        """Changes whenever a server comes back (its cache lost): plans made before are void."""
        return sum(s.availability.epoch for s in self.servers)

    def predict(self, server: Server, request: RequestTensors) -> TierHits:
        """The hits `request` should find at `server`; the models then hold what follows it."""
        if self.plan_cache is not None:
            self.plan_cache.predict_tiers(request)  # the plan's view moves on as if affinity held
        if self.many:
            bit, visited = 1 << server.index, self._visited
            for key in request.user_ids.tolist():
                visited[key] = visited.get(key, 0) | bit
        return server.cache.predict_tiers(request)

    def forget(self, server: Server, request: RequestTensors) -> None:
        """A failed request: its keys' state at `server` (and in the plan's view) is unknown."""
        server.cache.forget(request)
        if self.plan_cache is not None:
            self.plan_cache.forget(request)

    def lost_cache(self, server: Server) -> None:
        """`server` came back empty."""
        server.cache.clear()
        if self.plan_cache is not None:
            self.plan_cache.clear()

    def retire(self, keys: Iterable[int]) -> None:
        """Keys never to be sent again, at every server they were sent to."""
        keys = list(keys)
        if self.plan_cache is not None:
            self.plan_cache.retire(keys)
        if not self.many:
            self.servers[0].cache.retire(keys)
            return
        for key in keys:
            visited, i = self._visited.pop(key, 0), 0
            while visited:
                if visited & 1:
                    self.servers[i].cache.retire((key,))
                visited, i = visited >> 1, i + 1
