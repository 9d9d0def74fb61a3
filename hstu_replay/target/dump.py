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
from hstu_replay.request import UserRequest, build_request
from hstu_replay.target.engine import PackagedRanker

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


def write_reference_dumps(engine: PackagedRanker, store_path: str, out: str | Path, batches: int, batch_size: int,
                          candidates: int, max_history: int | None, seed: int, min_history: int = 1) -> int:
    config = engine.config
    max_history = min(max_history or config.max_history, config.max_history)
    if candidates > config.max_candidates:
        raise ConfigError(f"--candidates {candidates}: the {config.name} model takes at most {config.max_candidates}")
    store = SequenceStore.open(store_path)
    rng = np.random.default_rng(seed)
    limits = Limits(max_batch=8, max_values=10**7, max_candidates=config.max_candidates, max_history=max_history)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for index in range(batches):
        users = draw_users(store, batch_size, candidates, max_history, rng, min_history)
        users = [replace(u, cache_key=DUMP_KEY_BASE + index * 8 + slot) for slot, u in enumerate(users)]
        request = build_request(users, limits)
        result = engine.infer(request)
        write_dump_batch(out, index, {
            "values": request.values, "lengths": request.lengths, "num_candidates": request.num_candidates,
            "user_ids": request.user_ids, "total_history_lengths": request.total_history_lengths,
            "compiled_logits": result.logits,
            "compiled_offload_task_ids": np.full(request.batch_size, -1, dtype=np.int64),
        })
    write_feature_keys(out, FEATURE_KEYS)
    return batches
