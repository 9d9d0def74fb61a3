"""The reference target's KV-cache pools as a dimension of `capacity run`: with `--budgets G,...
--host-budgets H,...` the step search runs against the target served with each (GPU pool, host
pool) pair in turn, one fresh server per pair, so the answer is users per GPU before p99 breaks the
SLO, per tier budget (one server stands for one GPU)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from hstu_replay.errors import ServerError
from hstu_replay.process import STOP_GRACE_S, ServerProcess, StartFailed

SERVE_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class TargetPools:
    """One server's pools: GPU (the primary pool on a CPU) and host tier, in tokens (host 0: none)."""

    gpu_tokens: int
    host_tokens: int
    offload_mode: str = "native"

    @property
    def name(self) -> str:
        """Its folder under the output: g<GPU tokens>_h<host tokens>."""
        return f"g{self.gpu_tokens}_h{self.host_tokens}"

    def serve_args(self) -> tuple[str, ...]:
        """The reference target's options for these pools."""
        return ("--cache-budget-tokens", str(self.gpu_tokens), "--host-budget-tokens", str(self.host_tokens),
                "--offload-mode", self.offload_mode)

    def as_dict(self) -> dict:
        return {"gpu_tokens": self.gpu_tokens, "host_tokens": self.host_tokens, "offload_mode": self.offload_mode}


def pool_pairs(gpu: tuple[int, ...], host: tuple[int, ...], offload_mode: str) -> tuple[TargetPools, ...]:
    """Every (GPU, host) pair, GPU budgets outermost."""
    return tuple(TargetPools(g, h, offload_mode) for g, h in product(gpu, host))


@contextmanager
def served(repository: str, pools: TargetPools, log: Path, serve_args: tuple[str, ...] = ()) -> Iterator[ServerProcess]:
    """The reference target of `repository` with `pools`, ready on free loopback ports; stopped on exit."""
    server = ServerProcess.serve(repository, log, None, *pools.serve_args(), *serve_args,
                                 ready_timeout_s=SERVE_TIMEOUT_S)
    try:
        server.launch()
    except StartFailed as exc:
        raise ServerError(f"the target did not start with pools {pools.name}: {exc}") from None
    try:
        yield server
    finally:
        server.stop(STOP_GRACE_S)
