"""Latency per logical request of the reference target's batched engine by cache tier: GPU hit, host hit, miss.

    python -m bench.tier_latency                     # small config on this CPU, in process
    python -m bench.tier_latency --device cuda --config kuairand-1k --dtype bfloat16
    python -m bench.tier_latency --targets python-backend,cpp-backend   # served, each tier's code beside the other

In process (no Triton) or served (`server serve --frontend F` on loopback, over gRPC: the Python
backend's host tier, host_tier.py, or the C++ backend's, cpp/backend/host_tier.cpp), one engine or
server per scenario, batches of `--batch` full-length users:
- GPU hit: the same batch again and again, all of it in the primary pool;
- host hit: two batches in turn with a primary pool of exactly one batch and a host tier of two,
  so every user of every timed request is onboarded from the host (checked on each answer);
- miss: fresh users every request, with the host tier (its offload paid) and without one (the
  reference every ratio is taken against).
Then the onboard and offload rates from the engine's own counters (served: its control model) over the timed
requests, beside a plain copy of the same bytes from host memory to the device (pinned on CUDA) as the machine's
reference rate. Every ratio is against the first row of the invocation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from bench.harness import ROOT, machine_load, table, this_command
from hstu_replay.cache_ledger import pages
from hstu_replay.interface import KVCACHE, Limits
from hstu_replay.request import RequestTensors, UserRequest, build_request
from hstu_replay.process import ServerProcess
from hstu_replay.server.batched import build_batched_engine
from hstu_replay.server.frontends import FRONTENDS, Engine
from hstu_replay.server.model_config import ModelConfig, get_config
from hstu_replay.server.host_tier import KVLayout, OffloadMode
from hstu_replay.server.model import build_model
from hstu_replay.server.serve_config import HostTierOptions
from hstu_replay.server.threads import apply_threads


@dataclass(frozen=True)
class Scenario:
    name: str
    gpu_batches: int  # primary pool budget, in batches of full-length users
    host_batches: int  # host tier budget, in batches (0: none)
    expect: str  # what every timed answer must show: gpu, host or miss


SCENARIOS = (
    Scenario("miss, no host tier (reference)", 1, 0, "miss"),
    Scenario("GPU hit", 1, 2, "gpu"),
    Scenario("host hit (onboard)", 1, 2, "host"),
    Scenario("miss, with host tier (offload)", 1, 2, "miss"),
)


def make_users(cfg: ModelConfig, first_key: int, batch: int, candidates: int) -> list[UserRequest]:
    rng = np.random.default_rng(first_key)
    return [UserRequest(first_key + i, tuple(int(x) for x in rng.integers(1, 10, 5)),
                        rng.integers(1, 10**7, cfg.max_history), rng.integers(0, 256, cfg.max_history),
                        rng.integers(1, 10**7, candidates)) for i in range(batch)]


def requests_for(expect: str, cfg: ModelConfig, batch: int, candidates: int) -> Iterator[RequestTensors]:
    """The timed requests of a scenario, endlessly (after the warm-up the caller does)."""
    # full-length users: past the published package's 40,000 values at batch 8 (the engine takes them,
    # as NVIDIA's protocol runs do)
    limits = Limits(max_batch=batch, max_values=batch * (2 * (cfg.max_history + candidates) + 6),
                    max_candidates=candidates, max_history=cfg.max_history)
    fixed = [build_request(make_users(cfg, 1_000_000 * (i + 1), batch, candidates), limits) for i in range(2)]
    turn = 0
    while True:
        turn += 1
        if expect == "miss":
            yield build_request(make_users(cfg, 10_000_000 + turn * batch, batch, candidates), limits)
        else:  # gpu: always the first batch; host: the two in turn
            yield fixed[turn % 2 if expect == "host" else 0]


def check(expect: str, request: RequestTensors, cached: np.ndarray, host: np.ndarray, chunk: int) -> None:
    """Each user's tokens as the tiers must answer them; the host holds whole chunks of `chunk` tokens
    (native offload) and that is all a host hit reuses (the GPU pool lost the user)."""
    totals = request.total_history_lengths
    onboarded = totals // chunk * chunk
    want = {"gpu": (totals, 0 * totals), "host": (onboarded, onboarded), "miss": (0 * totals, 0 * totals)}[expect]
    if cached.tolist() != want[0].tolist() or host.tolist() != want[1].tolist():
        raise SystemExit(f"tier_latency: a {expect} request answered CACHED_TOKENS {cached.tolist()}, "
                         f"HOST_CACHED_TOKENS {host.tolist()}")


class Target(Protocol):
    """One scenario's cache: answers a request with (CACHED_TOKENS, HOST_CACHED_TOKENS); its counters."""

    def infer(self, request: RequestTensors) -> tuple[np.ndarray, np.ndarray]: ...

    def stats(self) -> dict[str, int]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Setup:
    """What every scenario's target is built from."""

    cfg: ModelConfig
    device: str
    page_tokens: int
    threads: int
    work: Path  # served targets' logs and repository (the C++ backend's package is compiled there once)


class InProcess:
    """The batched engine in this process, no Triton."""

    def __init__(self, setup: Setup, model: torch.nn.Module, gpu_tokens: int, host: HostTierOptions) -> None:
        self.engine = build_batched_engine(model, gpu_tokens, setup.page_tokens, host)

    def infer(self, request: RequestTensors) -> tuple[np.ndarray, np.ndarray]:
        result = self.engine.infer(request)
        return result.cached_tokens, result.host_cached_tokens

    def stats(self) -> dict[str, int]:
        return self.engine.cache.stats()

    def close(self) -> None:
        pass


class Served:
    """`server serve --frontend <frontend>` of the batched engine on loopback, driven over gRPC (the
    Python frontends' eager one; the C++ backend's, compiled, is the only one it serves)."""

    def __init__(self, frontend: str, setup: Setup, gpu_tokens: int, host: HostTierOptions) -> None:
        from hstu_replay.client.triton import ClientOptions, TritonClient

        cfg = setup.cfg
        served = FRONTENDS[frontend].engines  # the eager batched engine where the frontend serves it
        engine = Engine.BATCHED if Engine.BATCHED in served else Engine.BATCHED_AOTI
        self.server = ServerProcess.serve(
            setup.work / "repository", setup.work / f"{frontend}.log", None, "--frontend", frontend,
            "--engine", engine, "--config", cfg.name, "--dtype", cfg.dtype, "--device", setup.device,
            "--page-tokens", str(setup.page_tokens), "--threads", str(setup.threads),
            "--cache-budget-tokens", str(gpu_tokens), "--host-budget-tokens", str(host.budget_tokens),
            "--offload-mode", host.mode.value, "--offload-chunk-tokens", str(host.chunk_tokens),
            ready_timeout_s=900, cwd=ROOT).launch()
        self.client = TritonClient(ClientOptions(url=self.server.grpc_url, model=KVCACHE.model_name))
        self.client.connect()

    def infer(self, request: RequestTensors) -> tuple[np.ndarray, np.ndarray]:
        answer = self.client.infer(request)
        return answer.cached_tokens, answer.host_cached_tokens

    def stats(self) -> dict[str, int]:
        from hstu_replay.server.cpp_backend import ControlModelStats  # any frontend's control model

        return ControlModelStats(self.server.http_url).stats()

    def close(self) -> None:
        self.client.close()
        self.server.stop()


def run(target: Target, expect: str, cfg: ModelConfig, batch: int, candidates: int, warm: int,
        repeats: int, chunk: int) -> tuple[list[float], dict[str, int]]:
    """Seconds of each timed request, and what the cache's counters added over them."""
    source = requests_for(expect, cfg, batch, candidates)
    for _ in range(warm):
        target.infer(next(source))
    before = target.stats()
    seconds = []
    for _ in range(repeats):
        request = next(source)
        started = time.perf_counter()
        cached, host = target.infer(request)
        seconds.append(time.perf_counter() - started)
        check(expect, request, cached, host, chunk)
    return seconds, {k: v - before[k] for k, v in target.stats().items()}


def copy_rate(nbytes: int, device: torch.device, repeats: int = 5) -> float:
    """GB/s of a plain host-to-device copy of `nbytes` (from pinned memory on CUDA)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="small")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the config's")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warm", type=int, default=4, help="untimed requests first (at least 2: fills both tiers)")
    parser.add_argument("--offload-mode", default="flexkv", choices=[m.value for m in OffloadMode])
    parser.add_argument("--page-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="model threads (default: the server's policy)")
    parser.add_argument("--targets", default="in-process",
                        help="comma-separated: in-process, or a frontend served on loopback (pytriton, python-backend, "
                             "cpp-backend)")
    args = parser.parse_args()
    targets = args.targets.split(",")
    if not set(targets) <= {"in-process", *FRONTENDS}:
        raise SystemExit(f"tier_latency: --targets {args.targets}: in-process or {', '.join(FRONTENDS)}")
    threads = apply_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("tier_latency: --device cuda: no CUDA device is visible")
    if args.warm < 2 or args.repeats < 1 or not 1 <= args.batch:
        raise SystemExit("tier_latency: --warm must be at least 2, --repeats and --batch at least 1")
    cfg = get_config(args.config, args.dtype)
    if args.batch > cfg.max_batch or args.candidates > cfg.max_candidates:
        raise SystemExit(f"tier_latency: the {cfg.name} config takes at most {cfg.max_batch} users of "
                         f"{cfg.max_candidates} candidates")
    device = torch.device(args.device)
    model = build_model(cfg, seed=0).to(device) if "in-process" in targets else None
    batch_tokens = args.batch * pages(cfg.max_history_tokens, args.page_tokens) * args.page_tokens
    rows, copies, reference = [], [], None
    with tempfile.TemporaryDirectory(prefix="tier-latency-") as work:
        setup = Setup(cfg, args.device, args.page_tokens, threads, Path(work))
        for name in targets:
            tiers = {}
            for scenario in SCENARIOS:
                host = HostTierOptions(scenario.host_batches * batch_tokens, OffloadMode(args.offload_mode))
                gpu_tokens = scenario.gpu_batches * batch_tokens
                target = (InProcess(setup, model, gpu_tokens, host) if name == "in-process"
                          else Served(name, setup, gpu_tokens, host))
                try:
                    seconds, tiers[scenario.expect] = run(
                        target, scenario.expect, cfg, args.batch, args.candidates, args.warm, args.repeats,
                        host.chunk_tokens if host.mode is OffloadMode.NATIVE else 1)
                finally:
                    target.close()
                p50 = statistics.median(seconds) * 1e3
                reference = reference or p50
                rows.append([name, scenario.name, p50, p50 / args.batch, max(seconds) * 1e3, p50 / reference])
            onboard, offload = tiers["host"], tiers["miss"]
            copies.append([name, onboard["onboarded_bytes"], rate(onboard, "onboard"), rate(offload, "offload")])
    print(f"# {this_command()}")
    print(f"# {cfg.name} ({cfg.dtype}) on {args.device}, batch {args.batch} of {cfg.max_history_tokens} history "
          f"tokens + {args.candidates} candidates, {args.offload_mode} offload, {args.repeats} timed requests "
          f"each, {threads} model thread(s); load {machine_load()}")
    print(table(["target", "scenario", "ms per request (p50)", "ms per logical request", "ms max", "x reference"],
                rows))
    layout = KVLayout(cfg.num_layers, cfg.num_heads, cfg.head_dim, getattr(torch, cfg.dtype))
    batch_bytes = args.batch * cfg.max_history_tokens * layout.bytes_per_token
    print(table(["target", "bytes onboarded", "onboard GB/s", "offload GB/s"], copies))
    print(f"plain host-to-{args.device} copy of one batch ({batch_bytes:,} bytes): "
          f"{copy_rate(batch_bytes, device):.3g} GB/s")
    return 0


def rate(counters: dict[str, int], what: str) -> float:
    """GB/s of the onboard or offload copies the counters saw."""
    return counters[f"{what}ed_bytes"] / max(counters[f"{what}_micros"], 1) / 1e3


if __name__ == "__main__":
    raise SystemExit(main())
