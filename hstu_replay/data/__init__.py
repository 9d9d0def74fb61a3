"""KuaiRand-1K raw logs -> a compact, memory-mapped store of per-user sequences.

- `schema`: the raw files' names, columns and category strings.
- `synth.synthesize`: raw files of the same schema, for tests, demos and benchmarks.
- `prepare.prepare`: NVIDIA's sequence building (join, concatenate, stable sort, bitmask).
- `store`: the store's layout, `write_store` and `SequenceStore` (mmap reader).
- `summary`: what `hstu-replay data inspect` prints.

The store reader needs only numpy; `prepare` and `synthesize` (pyarrow) load on first use.
"""

from __future__ import annotations

from hstu_replay.data.store import SequenceStore, StoreMeta, UserHistory, write_store

__all__ = ["SequenceStore", "StoreMeta", "UserHistory", "prepare", "synthesize", "write_store"]


def __getattr__(name: str):
    if name == "prepare":
        from hstu_replay.data.prepare import prepare

        return prepare
    if name == "synthesize":
        from hstu_replay.data.synth import synthesize

        return synthesize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
