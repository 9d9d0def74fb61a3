"""CUDA graphs for the batched engine's fully cached step, which is bound by kernel launches, not by the GPU.

A fully cached request computes only its candidates: ~45 small kernels whose launches cost more
host time than the GPU spends on them. Replaying the step as one CUDA graph launches it once.
A graph has fixed shapes, so a step is padded to a `StepShape`: the candidates to the next power
of two, the attention work items to the next power of two of the most its blocks can be split into
(`WorkPlan.capacity`, so that users of other lengths share the graph; padding items have no rows:
their programs do nothing), the page table to the largest request's (`max_batch` users x the pages of a full
history). Every index the step needs travels packed in one int64 array (`StepShape.pack`, each
part 16 bytes aligned), staged in one pinned host buffer and copied to the device in one copy.
Graphs live in a small LRU keyed by shape and are dropped when the page pool is reallocated (they
hold its addresses).
`HSTU_REPLAY_CUDA_GRAPHS=0` turns them off.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hstu_replay.server.model import ITEM_KIND

ENV = "HSTU_REPLAY_CUDA_GRAPHS"
MIN_CANDIDATES = 16  # smallest padded candidate count
MIN_ITEMS = 16  # smallest padded work-item count
CAPACITY = 8  # graphs kept (least recently used goes first)
ITEM_FIELDS = 7


def graphs_enabled(device: torch.device) -> bool:
    return device.type == "cuda" and os.environ.get(ENV, "1") != "0"


#: int64 values a packed part's start is a multiple of: 16 bytes, the alignment a compiled step's
#: inputs were compiled for (a package copies a misaligned input on every call); the C++ backend's
#: step_layout.h aligns its parts the same way
ALIGN = 2


def packed_offsets(lengths: list[int]) -> list[int]:
    """Where each of the parts of `lengths` starts in one packed array, each start aligned (`ALIGN`),
    and the array's length last."""
    at = [0]
    for n in lengths:
        at.append(at[-1] + -(-int(n) // ALIGN) * ALIGN)
    return at


def pack_parts(parts: list[np.ndarray]) -> np.ndarray:
    """`parts` laid out in one int64 array at `packed_offsets` (the gaps zero)."""
    at = packed_offsets([len(p) for p in parts])
    packed = np.zeros(at[-1], dtype=np.int64)
    for start, part in zip(at, parts):
        packed[start:start + len(part)] = part
    return packed


def unpack_parts(packed: Tensor, lengths: list[int]) -> list[Tensor]:
    """The views of `packed` (laid out by `packed_offsets`) holding parts of `lengths`."""
    return [packed.narrow(0, start, int(n)) for start, n in zip(packed_offsets(lengths), lengths)]


def bucket(n: int, minimum: int) -> int:
    """The padded size of `n`: the next power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@dataclass(frozen=True)
class StepInputs:
    """A fully cached step's device inputs, views into one packed array."""

    ids: Tensor
    kinds: Tensor
    positions: Tensor
    page_table: Tensor
    items: Tensor


@dataclass(frozen=True)
class StepShape:
    """The padded shape of a fully cached step: one graph per shape."""

    candidates: int
    items: int
    rows: int  # page-table rows (users)
    pages: int  # page-table columns
    split: bool  # the attention plan adds partial sums (`WorkPlan.split`)

    @classmethod
    def of(cls, candidates: int, items: int, rows: int, pages: int, split: bool) -> StepShape:
        return cls(bucket(candidates, MIN_CANDIDATES), bucket(items, MIN_ITEMS), rows, pages, split)

    @property
    def sizes(self) -> list[int]:
        return [self.candidates] * 3 + [self.rows * self.pages, self.items * ITEM_FIELDS]

    @property
    def length(self) -> int:
        return packed_offsets(self.sizes)[-1]

    def pack(self, ids: np.ndarray, positions: np.ndarray, page_table: np.ndarray, items: np.ndarray,
             out: np.ndarray | None = None) -> np.ndarray:
        """Lay a step's indices out as this shape's int64 array (into `out` when given): candidates' ids,
        kinds and positions (padding: item 0 at position 0), the page table (padding: page 0), the work
        items (padding: items of no rows)."""
        n, (users, width), count = len(ids), page_table.shape, len(items)
        if n > self.candidates or users > self.rows or width > self.pages or count > self.items:
            raise ValueError(f"a step of {n} candidates, {count} items and a {users}x{width} page table "
                             f"does not fit {self}")
        packed = np.zeros(self.length, dtype=np.int64) if out is None else out[:self.length]
        packed[:] = 0
        ids_at, kinds_at, pos_at, table_at, items_at = packed_offsets(self.sizes)[:-1]
        packed[ids_at:ids_at + n] = ids
        packed[kinds_at:kinds_at + self.candidates] = ITEM_KIND
        packed[pos_at:pos_at + n] = positions
        packed[table_at:table_at + self.rows * self.pages].reshape(self.rows, self.pages)[:users, :width] = page_table
        packed[items_at:items_at + count * ITEM_FIELDS] = items.ravel()
        return packed

    def unpack(self, packed: Tensor) -> StepInputs:
        ids, kinds, positions, table, items = unpack_parts(packed, self.sizes)
        return StepInputs(ids, kinds, positions, table.view(self.rows, self.pages), items.view(self.items, ITEM_FIELDS))


class GraphLRU:
    """At most `capacity` values by key, the least recently used dropped first."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict = OrderedDict()

    def get(self, key, build: Callable):
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = self._entries[key] = build()
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list:
        return list(self._entries)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    packed: Tensor  # the graph's device input
    logits: Tensor  # its output


class StepGraphs:
    """Captures and replays `compute(inputs, split) -> logits` of fully cached steps on `device`."""

    def __init__(self, compute: Callable[[StepInputs, bool], Tensor], device: torch.device,
                 capacity: int = CAPACITY) -> None:
        self.compute = compute
        self.device = device
        self.graphs = GraphLRU(capacity)
        self.generation = -1  # of the page pool the graphs were captured on
        self._staging = torch.empty(0, dtype=torch.int64)

    def run(self, shape: StepShape, ids: np.ndarray, positions: np.ndarray, page_table: np.ndarray,
            items: np.ndarray, pool_generation: int) -> np.ndarray:
        if pool_generation != self.generation:
            self.graphs.clear()
            self.generation = pool_generation
        if self._staging.numel() < shape.length:
            self._staging = torch.empty(bucket(shape.length, 1 << 12), dtype=torch.int64, pin_memory=True)
        shape.pack(ids, positions, page_table, items, out=self._staging.numpy())
        entry = self.graphs.get(shape, lambda: self._capture(shape))
        entry.packed.copy_(self._staging[:shape.length], non_blocking=True)
        entry.graph.replay()
        return entry.logits[:len(ids)].cpu().numpy()

    def _capture(self, shape: StepShape) -> _Graph:
        packed = torch.empty(shape.length, dtype=torch.int64, device=self.device)
        packed.copy_(self._staging[:shape.length])
        inputs = shape.unpack(packed)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # compiles the kernels and settles the allocator outside the capture
            self.compute(inputs, shape.split)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            logits = self.compute(inputs, shape.split)
        return _Graph(graph, packed, logits)
