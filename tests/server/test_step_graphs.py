"""CUDA graphs of the fully cached step: padding, packing and the LRU on any machine; the graphs on a GPU."""

import numpy as np
import pytest
import torch

from hstu_replay.server.batched import build_batched_engine
from hstu_replay.server.model import ITEM_KIND, build_model
from hstu_replay.server.step_graphs import ENV, GraphLRU, StepShape, bucket, graphs_enabled, pack_parts, unpack_parts
from tests.server.test_engine import SMALL, make_user, serve


def test_bucket_is_the_next_power_of_two_at_least_the_minimum():
    assert [bucket(n, 16) for n in (0, 1, 16, 17, 100, 800, 1024, 1025)] == [16, 16, 16, 32, 128, 1024, 1024, 2048]
    assert bucket(3, 1) == 4 and bucket(1, 1) == 1


def test_shape_pads_candidates_and_items_but_keeps_the_table():
    shape = StepShape.of(candidates=800, items=70, rows=8, pages=33, split=True)
    assert (shape.candidates, shape.items, shape.rows, shape.pages, shape.split) == (1024, 128, 8, 33, True)
    assert StepShape.of(790, 65, 8, 33, True) == shape  # one graph for both
    assert shape.length == 3 * 1024 + 8 * 33 + 128 * 7


def test_pack_lays_out_and_pads_each_part():
    shape = StepShape.of(candidates=3, items=2, rows=3, pages=4, split=False)  # 16 candidates, 16 items
    ids, positions = np.array([7, 8, 9]), np.array([50, 50, 61])
    table = np.array([[4, 5], [6, 7]])
    items = np.arange(14).reshape(2, 7)
    packed = shape.pack(ids, positions, table, items)
    assert packed.dtype == np.int64 and len(packed) == 16 * 3 + 12 + 16 * 7
    assert packed[:16].tolist() == [7, 8, 9] + [0] * 13
    assert packed[16:32].tolist() == [ITEM_KIND] * 16
    assert packed[32:48].tolist() == [50, 50, 61] + [0] * 13
    assert packed[48:60].tolist() == [4, 5, 0, 0, 6, 7, 0, 0, 0, 0, 0, 0]
    assert packed[60:74].tolist() == list(range(14)) and not packed[74:].any()  # padding items: no rows
    inputs = shape.unpack(torch.from_numpy(packed))
    assert inputs.page_table.shape == (3, 4) and inputs.page_table[1].tolist() == [6, 7, 0, 0]
    assert inputs.items.shape == (16, 7) and inputs.items[1].tolist() == list(range(7, 14))
    assert inputs.ids.tolist()[:3] == [7, 8, 9] and inputs.positions.tolist()[2] == 61


def test_every_packed_part_starts_16_bytes_aligned():
    # a compiled step copies an input that is not aligned as it was compiled for, on every call
    shape = StepShape.of(candidates=3, items=2, rows=3, pages=3, split=False)  # a table of 9 cells
    table, items = np.arange(9).reshape(3, 3), np.arange(14).reshape(2, 7)
    packed = torch.from_numpy(shape.pack(np.array([7, 8, 9]), np.array([5, 5, 5]), table, items))
    assert len(packed) == 16 * 3 + 10 + 16 * 7  # the table's part padded by one value
    inputs = shape.unpack(packed)
    assert inputs.page_table.tolist() == table.tolist() and inputs.items[:2].tolist() == items.tolist()
    for part in (inputs.ids, inputs.kinds, inputs.positions, inputs.page_table, inputs.items):
        assert (part.data_ptr() - packed.data_ptr()) % 16 == 0
    # the same for the uncaptured step's parts (odd lengths), laid out by hand
    parts = [np.array([1, 2, 3]), np.array([4]), np.array([5, 6]), np.array([7, 8, 9, 10, 11])]
    packed = torch.from_numpy(pack_parts(parts))
    assert packed.tolist() == [1, 2, 3, 0, 4, 0, 5, 6, 7, 8, 9, 10, 11, 0]
    views = unpack_parts(packed, [len(p) for p in parts])
    assert [v.tolist() for v in views] == [p.tolist() for p in parts]
    assert all((v.data_ptr() - packed.data_ptr()) % 16 == 0 for v in views)


def test_pack_into_a_dirty_buffer_leaves_no_trace_of_the_last_step():
    shape = StepShape.of(2, 1, 1, 2, False)
    buffer = np.full(shape.length + 5, 99, dtype=np.int64)
    packed = shape.pack(np.array([1, 2]), np.array([3, 3]), np.array([[1]]), np.zeros((1, 7)), out=buffer)
    assert np.shares_memory(packed, buffer)
    np.testing.assert_array_equal(packed, shape.pack(np.array([1, 2]), np.array([3, 3]), np.array([[1]]),
                                                     np.zeros((1, 7))))


def test_a_step_larger_than_its_shape_is_refused():
    shape = StepShape(candidates=4, items=2, rows=1, pages=2, split=False)
    with pytest.raises(ValueError, match="does not fit"):
        shape.pack(np.arange(5), np.arange(5), np.zeros((1, 2)), np.zeros((1, 7)))
    with pytest.raises(ValueError, match="does not fit"):
        shape.pack(np.arange(2), np.arange(2), np.zeros((1, 3)), np.zeros((1, 7)))


def test_the_lru_builds_once_per_key_and_drops_the_least_recently_used():
    built = []
    lru = GraphLRU(capacity=2)

    def build(key):
        return lambda: built.append(key) or f"graph {key}"

    assert lru.get("a", build("a")) == "graph a"
    assert lru.get("b", build("b")) == "graph b"
    assert lru.get("a", build("a")) == "graph a"  # a is now the most recent
    lru.get("c", build("c"))  # drops b
    assert lru.keys() == ["a", "c"] and built == ["a", "b", "c"]
    lru.get("b", build("b"))
    assert lru.keys() == ["c", "b"] and built == ["a", "b", "c", "b"]
    lru.clear()
    assert len(lru) == 0


def test_graphs_only_on_a_gpu_and_not_when_turned_off(monkeypatch):
    assert not graphs_enabled(torch.device("cpu"))
    monkeypatch.setenv(ENV, "0")
    assert not graphs_enabled(torch.device("cuda"))
    monkeypatch.setenv(ENV, "1")
    assert graphs_enabled(torch.device("cuda"))


class Unrolled:
    """Pads and packs a fully cached step as the graphs do, then runs it eagerly (capturing needs a GPU)."""

    def __init__(self, step):
        self.step, self.shapes = step, []

    def run(self, shape, ids, positions, page_table, items, generation):
        self.shapes.append(shape)
        inputs = shape.unpack(torch.from_numpy(shape.pack(ids, positions, page_table, items)))
        return self.step(inputs, shape.split)[:len(ids)].numpy()


def test_a_padded_fully_cached_step_gives_the_unpadded_logits():
    model = build_model(SMALL, seed=0)
    plain, padded = (build_batched_engine(model, 1 << 13, 32) for _ in range(2))
    padded.graphs = Unrolled(padded.step)
    users = [make_user(300 + i, 40 + 17 * i, 3 + 2 * i, seed=i) for i in range(3)]
    first = [serve(engine, *users) for engine in (plain, padded)]
    assert padded.graphs.shapes == []  # nothing cached: no graph
    np.testing.assert_array_equal(first[0].logits, first[1].logits)
    again = [serve(engine, *users) for engine in (plain, padded)]
    assert not again[1].computed_tokens.any() and again[1].cached_tokens.all()  # fully cached
    [shape] = padded.graphs.shapes
    assert shape.candidates == 16 > 3 + 5 + 7 and shape.rows == SMALL.max_batch
    np.testing.assert_allclose(again[1].logits, again[0].logits, atol=1e-5, rtol=0)
    assert again[1].logits.shape == (15, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphs_on_a_gpu_match_eager_and_are_dropped_when_the_pool_grows(monkeypatch):
    model = build_model(SMALL, seed=0).to("cuda")
    monkeypatch.setenv(ENV, "0")
    eager = build_batched_engine(model, 1 << 13, 32)
    monkeypatch.setenv(ENV, "1")
    graphed = build_batched_engine(model, 1 << 13, 32)
    assert eager.graphs is None and graphed.graphs is not None
    users = [make_user(400 + i, 60, 4, seed=i) for i in range(4)]
    for _ in range(3):
        got, want = serve(graphed, *users), serve(eager, *users)
        np.testing.assert_allclose(got.logits, want.logits, atol=1e-5, rtol=0)
    assert len(graphed.graphs.graphs) == 1
    generation = graphed.cache.generation
    more = [make_user(500 + i, SMALL.max_history, 4, seed=i) for i in range(SMALL.max_batch)]
    serve(graphed, *more), serve(eager, *more)  # the pool grows
    assert graphed.cache.generation > generation
    got, want = serve(graphed, *more), serve(eager, *more)
    np.testing.assert_allclose(got.logits, want.logits, atol=1e-5, rtol=0)
    assert len(graphed.graphs.graphs) == 1 and graphed.graphs.generation == graphed.cache.generation

