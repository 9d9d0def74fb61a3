"""Reference dumps in NVIDIA's format, drawn from a prepared store and run cold-cache.

Each batch holds distinct users, each with a random-length prefix of its real history and
the events that follow as candidates; `compiled_logits` come from the compiled package.
A user may be drawn again in a later batch with another history length, so each drawn user
gets its own cache key (INPUT__3; `values` keep the real user id): every key appears once,
and replaying the whole dump twice (cold, then all hits) never shrinks a key's history.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from hstu_replay.data.store import SequenceStore
from hstu_replay.dumps.writer import write_dump_batch, write_feature_keys
from hstu_replay.errors import ConfigError
from hstu_replay.interface import FEATURE_KEYS, Limits
from hstu_replay.request import RequestTensors, UserRequest, build_request
from hstu_replay.server.model_config import ModelConfig
from hstu_replay.server.engine import PackagedRanker

DUMP_KEY_BASE = 1 << 40  # cache keys of dumped users: above any real KuaiRand user id


def draw_users(store: SequenceStore, batch_size: int, candidates: int, max_history: int,
               rng: np.random.Generator, min_history: int = 1) -> list[UserRequest]:
    eligible = [i for i in range(len(store)) if len(store.user(i).video_ids) > candidates]
    if len(eligible) < batch_size:
        raise ConfigError(f"only {len(eligible)} users have more than {candidates} events; "
                          f"lower --batch-size or --candidates")
    users = []
    for index in rng.choice(eligible, size=batch_size, replace=False):
        history = store.user(int(index))
        longest = min(len(history.video_ids) - candidates, max_history)
        items = int(rng.integers(min(max(min_history, 1), longest), longest + 1))
        users.append(UserRequest(
            user_id=history.user_id, context=history.context,
            history_items=np.asarray(history.video_ids[:items], dtype=np.int64),
            history_actions=np.asarray(history.actions[:items], dtype=np.int64),
            candidates=np.asarray(history.video_ids[items : items + candidates], dtype=np.int64),
        ))
    return users


def draw_requests(config: ModelConfig, store_path: str | Path, batches: int, batch_size: int, candidates: int,
                  max_history: int | None, seed: int, min_history: int = 1) -> list[RequestTensors]:
    """The dump's requests: `batches` batches of distinct users, each user under a key of its own."""
    max_history = min(max_history or config.max_history, config.max_history)
    if candidates > config.max_candidates:
        raise ConfigError(f"--candidates {candidates}: the {config.name} model takes at most {config.max_candidates}")
    store = SequenceStore.open(str(store_path))
    rng = np.random.default_rng(seed)
    limits = Limits(max_values=10**7, max_candidates=config.max_candidates, max_history=max_history)
    requests = []
    for index in range(batches):
        users = draw_users(store, batch_size, candidates, max_history, rng, min_history)
        users = [replace(u, cache_key=DUMP_KEY_BASE + index * limits.max_batch + slot) for slot, u in enumerate(users)]
        requests.append(build_request(users, limits))
    return requests


def dump_inputs(request: RequestTensors) -> dict[str, np.ndarray]:
    """A batch's input tensors as the KV-cache exporter names them (offload task ids: none)."""
    return {
        "values": request.values, "lengths": request.lengths, "num_candidates": request.num_candidates,
        "user_ids": request.user_ids, "total_history_lengths": request.total_history_lengths,
        "compiled_offload_task_ids": np.full(request.batch_size, -1, dtype=np.int64),
    }


def write_dump_inputs(requests: list[RequestTensors], out: str | Path) -> None:
    """The dump without reference logits (`hstu_replay_dump --produce-reference` adds them)."""
    for index, request in enumerate(requests):
        write_dump_batch(out, index, dump_inputs(request))
    write_feature_keys(out, FEATURE_KEYS)


def write_reference_dumps(engine: PackagedRanker, store_path: str, out: str | Path, batches: int, batch_size: int,
                          candidates: int, max_history: int | None, seed: int, min_history: int = 1) -> int:
    requests = draw_requests(engine.config, store_path, batches, batch_size, candidates, max_history, seed,
                             min_history)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for index, request in enumerate(requests):
        write_dump_batch(out, index, {**dump_inputs(request), "compiled_logits": engine.infer(request).logits})
    write_feature_keys(out, FEATURE_KEYS)
    return batches
