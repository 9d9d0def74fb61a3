"""perf_analyzer --input-data export: round trip, send order of primes and keys, CLI errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hstu_replay import cli
from hstu_replay.data.store import SequenceStore
from hstu_replay.errors import InputError
from hstu_replay.interface import KVCACHE, NOCACHE, Limits
from hstu_replay.plan.dealer import Dealer
from hstu_replay.plan.dumps import DumpedUser, DumpSource, pool_identities
from hstu_replay.plan.keys import KeyAllocator
from hstu_replay.plan.perf_analyzer import TraceEntry, plan_trace, read_trace, write_trace
from hstu_replay.plan.sessions import SessionSource, usable_users
from hstu_replay.request import RequestTensors, UserRequest

LIMITS = Limits(max_history=256)
FIELDS = ("values", "lengths", "num_candidates", "user_ids", "total_history_lengths")


@pytest.fixture(autouse=True)
def only_the_plan_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep these tests independent of the other command groups (built by others)."""
    monkeypatch.setattr(cli, "COMMAND_GROUPS", {"plan": "hstu_replay.plan.cli"})


def dump_pool(users: int = 10, repeats: int = 1) -> list[DumpedUser]:
    """`users` store users, each dumped `repeats` times (as several dump batches may hold one user)."""
    rng = np.random.default_rng(3)
    pool = []
    for r in range(repeats):
        for u in range(users):
            history = int(rng.integers(20, 200))
            request = UserRequest(500 + u, (1, 2, 3, 4, 5), rng.integers(1, 10**6, history),
                                  rng.integers(0, 256, history), rng.integers(1, 10**6, 8))
            pool.append(DumpedUser(request, None, f"batch {r} user {u}"))
    return pool


def dump_entries(interface=KVCACHE, target=0.5, worker=0, requests=6) -> list[TraceEntry]:
    pool = dump_pool()
    dealer = Dealer(range(len(pool)), identities=pool_identities(pool))
    source = DumpSource(pool, dealer, {}, KeyAllocator(worker, 0, nonce=11), LIMITS)
    return list(plan_trace(source, interface, target, 4, requests))


def assert_same(a: RequestTensors, b: RequestTensors) -> None:
    for field in FIELDS:
        assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_dump_trace_round_trip(tmp_path: Path) -> None:
    entries = dump_entries()
    out = tmp_path / "trace.json"
    summary = write_trace(iter(entries), KVCACHE, out)
    assert (summary.entries, summary.primes) == (len(entries), sum(e.is_prime for e in entries))
    assert summary.measured == 6 and summary.bytes_written == out.stat().st_size
    for entry, back in zip(entries, read_trace(out, KVCACHE), strict=True):
        assert_same(entry.request, back)


def test_file_follows_the_documented_format(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    write_trace(dump_entries(), KVCACHE, out)
    document = json.loads(out.read_text())
    assert list(document) == ["data"]
    for entry in document["data"]:
        assert list(entry) == list(KVCACHE.input_names)
        for tensor in entry.values():
            assert set(tensor) == {"content", "shape"}
            assert tensor["shape"] == [len(tensor["content"])]
            assert all(isinstance(v, int) for v in tensor["content"])


def test_session_trace_round_trip(sample_store: Path, tmp_path: Path) -> None:
    store = SequenceStore.open(sample_store)
    source = SessionSource(store, Dealer(usable_users(store, 8)), KeyAllocator(0, 0, nonce=2), 8, LIMITS)
    entries = list(plan_trace(source, KVCACHE, 0.75, 4, 12))
    assert any(e.is_prime for e in entries)
    out = tmp_path / "sessions.json"
    write_trace(entries, KVCACHE, out)
    back = read_trace(out, KVCACHE)
    assert len(back) == len(entries) == 12 + sum(e.is_prime for e in entries)
    for entry, request in zip(entries, back):
        assert_same(entry.request, request)
    assert_key_order(entries)


def assert_key_order(entries: list[TraceEntry]) -> None:
    """A prime opens a fresh key; a key's history never shrinks; one request per key at a time."""
    held: dict[int, int] = {}
    for entry in entries:
        keys = entry.request.user_ids.tolist()
        assert len(set(keys)) == len(keys)
        for key, tokens in zip(keys, entry.request.total_history_lengths.tolist()):
            if entry.is_prime:
                assert key not in held, "a prime reuses a key already sent"
            else:
                assert tokens >= held.get(key, 0), "a key's history shrank"
            held[key] = tokens


def test_prime_comes_right_before_its_request() -> None:
    entries = dump_entries(target=0.5)
    assert any(e.is_prime for e in entries)
    for i, entry in enumerate(entries):
        if entry.is_prime:
            follower = entries[i + 1]
            assert not follower.is_prime
            assert set(entry.request.user_ids.tolist()) <= set(follower.request.user_ids.tolist())
    assert_key_order(entries)


def test_keys_are_disjoint_across_steps_and_workers() -> None:
    measured = [e for e in dump_entries(worker=0) if not e.is_prime]
    other = [e for e in dump_entries(worker=1) if not e.is_prime]
    keys0 = [k for e in measured for k in e.request.user_ids.tolist()]
    keys1 = {k for e in other for k in e.request.user_ids.tolist()}
    assert len(set(keys0)) == len(keys0)  # dump replay: fresh keys every step
    assert not set(keys0) & keys1


def test_model_without_cache_gets_its_three_inputs_and_no_primes(tmp_path: Path) -> None:
    entries = dump_entries(NOCACHE, target=0.9)
    assert entries and not any(e.is_prime for e in entries)
    out = tmp_path / "nocache.json"
    write_trace(entries, NOCACHE, out)
    document = json.loads(out.read_text())
    assert all(list(e) == ["INPUT__0", "INPUT__1", "INPUT__2"] for e in document["data"])
    for entry, back in zip(entries, read_trace(out, NOCACHE)):
        assert np.array_equal(entry.request.values, back.values)


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    def broken():
        yield from dump_entries()[:2]
        raise RuntimeError("source failed")

    out = tmp_path / "trace.json"
    with pytest.raises(RuntimeError):
        write_trace(broken(), KVCACHE, out)
    assert list(tmp_path.iterdir()) == []


def test_read_trace_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    for text in ("not json", '{"rows": []}', '{"data": [{"INPUT__0": [1]}]}',
                 '{"data": [{"INPUT__0": {"content": [1, 2], "shape": [3]}, '
                 '"INPUT__1": {"content": [1]}, "INPUT__2": {"content": [1]}}]}'):
        bad.write_text(text)
        with pytest.raises(InputError):
            read_trace(bad, NOCACHE)


def test_cli_exports_sessions(sample_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    code = cli.main(["plan", "export-perf-analyzer", "--store", str(sample_store), "--out", str(out),
                     "--batch-size", "2", "--requests", "5", "--candidates", "8", "--key-nonce", "1"])
    stdout, stderr = capsys.readouterr()
    assert code == 0 and stderr == ""
    requests = read_trace(out, KVCACHE)
    assert f"{out}: {len(requests)} requests (5 measured" in stdout
    assert "--request-count" in stdout  # the KV-cache wrap-around note


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_cli_exports_a_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hstu_replay.dumps.writer import write_dump_batch
    from hstu_replay.request import build_request

    users = [d.request for d in dump_pool(6)]
    for index, batch in enumerate((users[:4], users[4:])):
        r = build_request(batch, LIMITS)
        write_dump_batch(tmp_path / "dump", index,
                         {"values": r.values, "lengths": r.lengths, "num_candidates": r.num_candidates})
    out = tmp_path / "t.json"
    code = cli.main(["plan", "export-perf-analyzer", "--dump-dir", str(tmp_path / "dump"), "--out", str(out),
                     "--model", "hstu_gr_ranking", "--batch-size", "3", "--requests", "4"])
    assert code == 0 and "(4 measured, 0 primes)" in capsys.readouterr().out
    requests = [[u.user_id for u in r.users()] for r in read_trace(out, NOCACHE)]
    assert all(len(set(ids)) == 3 for ids in requests)  # three distinct users per request
    sent = [i for ids in requests for i in ids]
    assert sorted(sent) == sorted(2 * [u.user_id for u in users])  # the pool of 6, twice, in a shuffled order
    by_id = {u.user_id: u for u in users}
    for r in read_trace(out, NOCACHE):
        for u in r.users():
            assert np.array_equal(u.history_items, by_id[u.user_id].history_items)


@pytest.mark.parametrize("args, message", [
    ([], "give exactly one of --dump-dir DIR or --store STORE"),
    (["--store", "s", "--dump-dir", "d"], "give exactly one of --dump-dir DIR or --store STORE"),
    (["--store", "s", "--model", "resnet"], "--model 'resnet': use one of"),
    (["--store", "s", "--hit-ratio", "1.5"], "--hit-ratio '1.5': use a hit ratio in 0..1"),
    (["--store", "s", "--model", "hstu_gr_ranking", "--hit-ratio", "0.5"], "has no KV cache"),
    (["--store", "s", "--batch-size", "9"], "--batch-size '9': use a whole number of users in 1..8"),
    (["--store", "s", "--requests", "0"], "--requests must be >= 1, got 0"),
    (["--store", "s", "--candidates", "101"], "--candidates must be 1..100, got 101"),
    (["--store", "/nonexistent/store"], "/nonexistent/store: no such store directory"),
    (["--dump-dir", "/nonexistent/dumps"], "/nonexistent/dumps: no such dump directory"),
])
def test_cli_errors_are_one_line(args: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "export-perf-analyzer", "--out", str(tmp_path / "t.json"), *args])
    _, stderr = capsys.readouterr()
    assert code in (1, 2)
    assert stderr.count("\n") == 1 and stderr.startswith("hstu-replay: error: ") and message in stderr
    assert not (tmp_path / "t.json").exists()


def test_cli_refuses_a_missing_output_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["plan", "export-perf-analyzer", "--store", "s", "--out", str(tmp_path / "no" / "t.json")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err
