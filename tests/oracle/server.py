"""An independent KV-cache oracle for `hstu_gr_ranking_kvcache`: it checks each request's wire layout,
keeps its own account of what a KV cache would hold, answers zero logits (and, optionally, the cached
tokens per user) and writes one JSON line per request it saw.

    python -m tests.oracle.server --grpc-port G --http-port H --metrics-port M --log PATH \
        [--cached-tokens] [--budget-tokens N] [--page-tokens P] [--max-values V]
        [--host-budget-tokens N [--offload-mode flexkv|native]]

With a host budget it keeps two tiers (`TwoTierCache`): the budget above is the GPU pool's, the
answer adds HOST_CACHED_TOKENS (the part of CACHED_TOKENS onboarded from the host), and a control
model `hstu_kvcache_control` says both budgets (GPU_BUDGET_TOKENS, HOST_BUDGET_TOKENS).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

MODEL_NAME = "hstu_gr_ranking_kvcache"
CONTROL_MODEL = "hstu_kvcache_control"
READY = "oracle: ready"
INPUT_NAMES = ["INPUT__0", "INPUT__1", "INPUT__2", "INPUT__3", "INPUT__4"]
NUM_FEATURES = 8  # user_id, 5 contextual features, video_id, action_weights
SINGLE_FEATURES = 6  # the features of length exactly 1 per user
NUM_TASKS = 8  # logits per candidate
MAX_BATCH = 8
MAX_VALUES = 40000
MAX_CANDIDATES = 100
MAX_HISTORY = 4096
DEFAULT_PAGE_TOKENS = 32


# ---------------------------------------------------------------------------------------------------------
# Wire layout


@dataclass
class ParsedRequest:
    """What a request says, per user, and what is wrong with it (an empty `violations` means well formed)."""

    keys: list[int] = field(default_factory=list)  # INPUT__3
    users: list[int] = field(default_factory=list)  # values[0:B]
    totals: list[int] = field(default_factory=list)  # INPUT__4
    candidates: list[int] = field(default_factory=list)  # INPUT__2
    histories: list[int] = field(default_factory=list)  # history items per user
    violations: list[str] = field(default_factory=list)


def _ints(array: Any) -> list[int]:
    return [int(x) for x in np.asarray(array).reshape(-1)]


def parse_request(values: Any, lengths: Any, num_candidates: Any, user_ids: Any, total_history_lengths: Any,
                  max_values: int = MAX_VALUES) -> ParsedRequest:
    """Read one request's five inputs; every layout or limit problem becomes a string in `violations`."""
    vals = _ints(values)
    lens = _ints(lengths)
    cands = _ints(num_candidates)
    keys = _ints(user_ids)
    totals = _ints(total_history_lengths)
    b = len(cands)
    parsed = ParsedRequest(keys=keys, totals=totals, candidates=cands)
    bad = parsed.violations

    if not 1 <= b <= MAX_BATCH:
        bad.append(f"limit: batch size {b} outside 1..{MAX_BATCH}")
    if len(vals) > max_values:
        bad.append(f"limit: {len(vals)} values > {max_values}")
    if len(keys) != b:
        bad.append(f"layout: {len(keys)} user_ids for {b} users")
    if len(totals) != b:
        bad.append(f"layout: {len(totals)} total_history_lengths for {b} users")
    if len(lens) != NUM_FEATURES * b:
        bad.append(f"layout: {len(lens)} lengths for {b} users (expected {NUM_FEATURES * b})")
    if any(n < 0 for n in lens):
        bad.append("layout: negative length")
    if any(c < 0 for c in cands):
        bad.append("layout: negative num_candidates")
    if len(vals) >= b:
        parsed.users = vals[:b]
    if b == 0 or len(lens) != NUM_FEATURES * b or any(n < 0 for n in lens):
        return parsed  # the per-user reading below needs 8*B non-negative lengths
    if sum(lens) != len(vals):
        bad.append(f"layout: lengths sum to {sum(lens)} but there are {len(vals)} values")

    for f in range(SINGLE_FEATURES):
        for u in range(b):
            if lens[f * b + u] != 1:
                bad.append(f"layout: feature {f} of user {u} has length {lens[f * b + u]} (expected 1)")
    for u in range(b):
        items = lens[SINGLE_FEATURES * b + u]  # video_id
        weights = lens[(SINGLE_FEATURES + 1) * b + u]  # action_weights
        if items != weights:
            bad.append(f"layout: user {u} has {items} video_id and {weights} action_weights values")
        cand = cands[u]
        hist = items - cand
        parsed.histories.append(hist)
        if cand > items:
            bad.append(f"layout: user {u} has {cand} candidates but only {items} items")
        if cand > MAX_CANDIDATES:
            bad.append(f"limit: user {u} has {cand} candidates > {MAX_CANDIDATES}")
        if hist > MAX_HISTORY:
            bad.append(f"limit: user {u} has {hist} history items > {MAX_HISTORY}")
        if u < len(totals) and hist >= 0 and totals[u] != 6 + 2 * hist:
            bad.append(f"layout: user {u} total_history_length {totals[u]} != 6 + 2*{hist}")

    for name, seq in (("key", keys), ("user", parsed.users)):
        seen: set[int] = set()
        for x in seq:
            if x in seen:
                bad.append(f"duplicate {name}: {x}")
            seen.add(x)
    return parsed


# ---------------------------------------------------------------------------------------------------------
# Cache bookkeeping


class OracleCache:
    """Tokens held per cache key, least recently used first; optionally bounded by a page budget."""

    def __init__(self, budget_tokens: int = 0, page_tokens: int = DEFAULT_PAGE_TOKENS) -> None:
        if page_tokens < 1:
            raise ValueError("page_tokens must be >= 1")
        self.page_tokens = page_tokens
        # None: unbounded
        self.capacity_pages: int | None = budget_tokens // page_tokens if budget_tokens > 0 else None
        self.held: dict[int, int] = {}  # key -> tokens; dict order is recency, oldest first

    def pages(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    def used_pages(self) -> int:
        return sum(self.pages(t) for t in self.held.values())

    def shrinking(self, keys: list[int], totals: list[int]) -> list[str]:
        """Keys whose new total is shorter than what they hold."""
        return [f"shrinking key: {k} total {t} < held {self.held[k]}"
                for k, t in zip(keys, totals) if t < self.held.get(k, 0)]

    def apply(self, keys: list[int], totals: list[int]) -> list[int]:
        """Account one (well-formed) request; returns the tokens each user reused."""
        hits = []
        for k, t in zip(keys, totals):
            hits.append(min(self.held.get(k, 0), t))
            self.held.pop(k, None)
            self.held[k] = t  # now the most recently used
        if self.capacity_pages is not None:
            self._evict(keys)
        return hits

    def _evict(self, request_keys: list[int]) -> None:
        capacity = self.capacity_pages
        assert capacity is not None
        for k in request_keys:
            if k in self.held and self.pages(self.held[k]) > capacity:
                del self.held[k]  # served but not kept
        protected = set(request_keys)
        used = self.used_pages()
        for k in [k for k in self.held if k not in protected]:  # oldest first
            if used <= capacity:
                return
            used -= self.pages(self.held.pop(k))
        for k in request_keys:
            if used <= capacity:
                return
            if k in self.held:
                used -= self.pages(self.held.pop(k))


class TwoTierCache:
    """A GPU pool and a host pool, each an `OracleCache` with its own budget (NVIDIA's two tiers).

    After a request every user of it sits in the GPU pool with its whole history. The host pool gets
    the whole history after every forward (`flexkv`), or the completed chunks of `chunk_tokens` (1,024)
    tokens (`native`).
    A lookup takes the longer of the two copies; when the host's is longer than the GPU's, all of the
    reused tokens count as onboarded from the host.
    """

    def __init__(self, gpu_budget_tokens: int, host_budget_tokens: int, page_tokens: int = DEFAULT_PAGE_TOKENS,
                 offload_mode: str = "flexkv", chunk_tokens: int = 1024) -> None:
        if offload_mode not in ("flexkv", "native"):
            raise ValueError(f"offload mode {offload_mode!r}")
        self.gpu = OracleCache(gpu_budget_tokens, page_tokens)
        self.host = OracleCache(host_budget_tokens, page_tokens)
        self.offload_mode = offload_mode
        self.chunk = chunk_tokens
        self.last_host_hits: list[int] = []

    @property
    def held(self) -> dict[int, int]:
        return self.gpu.held

    def shrinking(self, keys: list[int], totals: list[int]) -> list[str]:
        return self.gpu.shrinking(keys, totals)

    def apply(self, keys: list[int], totals: list[int]) -> list[int]:
        hits, host_hits = [], []
        for k, t in zip(keys, totals):
            on_gpu = self.gpu.held.get(k, 0)
            on_host = self.host.held.get(k, 0)
            if on_host > on_gpu:
                hits.append(min(on_host, t))
                host_hits.append(min(on_host, t))
            else:
                hits.append(min(on_gpu, t))
                host_hits.append(0)
        self.gpu.apply(keys, totals)
        if self.offload_mode == "flexkv":
            offloaded = list(totals)
        else:
            offloaded = [t - t % self.chunk for t in totals]
        offloaded = [max(o, self.host.held.get(k, 0)) for k, o in zip(keys, offloaded)]
        self.host.apply(keys, offloaded)
        self.last_host_hits = host_hits
        return hits


# ---------------------------------------------------------------------------------------------------------
# Record


class RequestLog:
    """One JSON line per request, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out: IO[str] = path.open("w")
        self._seq = 0

    def write(self, parsed: ParsedRequest, hits: list[int], host_hits: list[int] | None = None) -> None:
        line = {"seq": self._seq, "t": time.time(), "keys": parsed.keys, "users": parsed.users,
                "totals": parsed.totals, "hits": hits, "candidates": parsed.candidates,
                "violations": parsed.violations}
        if host_hits is not None:
            line["host_hits"] = host_hits
        self._seq += 1
        self._out.write(json.dumps(line) + "\n")
        self._out.flush()

    def close(self) -> None:
        self._out.close()


def read_log(path: Path | str) -> list[dict]:
    """The records in `path`; a torn (partly written) last line is left out."""
    records = []
    lines = Path(path).read_text().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return records


# ---------------------------------------------------------------------------------------------------------
# Serving


class OracleError(Exception):
    """A request the oracle refuses; the client's error message carries this text."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__("oracle: " + "; ".join(violations))
        self.violations = violations


class Oracle:
    """Parses, checks, accounts and records; one request at a time."""

    def __init__(self, cache: OracleCache | TwoTierCache, log: RequestLog, max_values: int = MAX_VALUES,
                 cached_tokens: bool = False) -> None:
        self.cache = cache
        self.log = log
        self.max_values = max_values
        self.cached_tokens = cached_tokens
        self._lock = threading.Lock()

    def handle(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """The response to one request; raises OracleError (after recording it) if it has a violation."""
        with self._lock:
            missing = [name for name in INPUT_NAMES if name not in inputs]
            if missing:
                parsed = ParsedRequest(violations=[f"layout: missing inputs {missing}"])
            else:
                parsed = parse_request(*(inputs[name] for name in INPUT_NAMES), max_values=self.max_values)
            if not parsed.violations:
                parsed.violations += self.cache.shrinking(parsed.keys, parsed.totals)
            if parsed.violations:
                self.log.write(parsed, [])
                raise OracleError(parsed.violations)
            hits = self.cache.apply(parsed.keys, parsed.totals)
            host_hits = self.cache.last_host_hits if isinstance(self.cache, TwoTierCache) else None
            self.log.write(parsed, hits, host_hits)
        b = len(parsed.keys)
        answer = {"OUTPUT__0": np.zeros((sum(parsed.candidates), NUM_TASKS), dtype=np.float32),
                  "OUTPUT__1": np.full(b, -1, dtype=np.int64)}
        if self.cached_tokens:
            answer["CACHED_TOKENS"] = np.asarray(hits, dtype=np.int64)
            if host_hits is not None:
                answer["HOST_CACHED_TOKENS"] = np.asarray(host_hits, dtype=np.int64)
        return answer

    def infer(self, requests: list) -> list[dict[str, np.ndarray]]:
        return [self.handle({name: request[name] for name in request}) for request in requests]


def serve(args: argparse.Namespace) -> None:
    from hstu_replay.server.serve import PROTECTED_ENDPOINTS, python_backend_env

    python_backend_env()
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    log = RequestLog(Path(args.log))
    two_tier = args.host_budget_tokens > 0
    cache = (TwoTierCache(args.budget_tokens, args.host_budget_tokens, args.page_tokens, args.offload_mode)
             if two_tier else OracleCache(args.budget_tokens, args.page_tokens))
    oracle_ = Oracle(cache, log, args.max_values, args.cached_tokens)
    inputs = [Tensor(name=name, dtype=np.int64, shape=(-1,)) for name in INPUT_NAMES]
    outputs = [Tensor(name="OUTPUT__0", dtype=np.float32, shape=(-1, NUM_TASKS)),
               Tensor(name="OUTPUT__1", dtype=np.int64, shape=(-1,))]
    if args.cached_tokens:
        outputs.append(Tensor(name="CACHED_TOKENS", dtype=np.int64, shape=(-1,)))
        if two_tier:
            outputs.append(Tensor(name="HOST_CACHED_TOKENS", dtype=np.int64, shape=(-1,)))
    config = TritonConfig(http_address="127.0.0.1", http_port=args.http_port, grpc_address="127.0.0.1",
                          grpc_port=args.grpc_port, metrics_address="127.0.0.1", metrics_port=args.metrics_port,
                          exit_on_error=True)
    try:
        with Triton(config=config,
                    security_config=TritonSecurityConfig(restricted_endpoints=PROTECTED_ENDPOINTS)) as triton:
            triton.bind(MODEL_NAME, oracle_.infer, inputs=inputs, outputs=outputs,
                        config=ModelConfig(batching=False))
            if two_tier:  # the two-tier contract's control model, with its budgets only
                budgets = {"GPU_BUDGET_TOKENS": args.budget_tokens, "HOST_BUDGET_TOKENS": args.host_budget_tokens}
                triton.bind(CONTROL_MODEL, lambda requests: [{name: np.array([value], dtype=np.int64)
                                                              for name, value in budgets.items()} for _ in requests],
                            inputs=[Tensor(name="CLEAR", dtype=np.int64, shape=(1,))],
                            outputs=[Tensor(name=name, dtype=np.int64, shape=(1,)) for name in budgets],
                            config=ModelConfig(batching=False))
            triton.run()
            print(f"{READY} on 127.0.0.1: grpc {args.grpc_port}, http {args.http_port}", flush=True)
            while not stop.wait(0.5):
                if not triton.is_alive():
                    raise SystemExit("oracle: tritonserver exited unexpectedly")
    finally:
        log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--log", required=True, help="JSON lines, one per request")
    parser.add_argument("--cached-tokens", action="store_true", help="add the CACHED_TOKENS output")
    parser.add_argument("--budget-tokens", type=int, default=0, help="cache budget in tokens (0: unbounded)")
    parser.add_argument("--page-tokens", type=int, default=DEFAULT_PAGE_TOKENS)
    parser.add_argument("--max-values", type=int, default=MAX_VALUES)
    parser.add_argument("--host-budget-tokens", type=int, default=0, help="host pool (0: one tier)")
    parser.add_argument("--offload-mode", default="flexkv", choices=("flexkv", "native"))
    serve(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
