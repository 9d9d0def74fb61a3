"""Natural replay against the real target under a cache budget: the hit ratio that emerges at the
server (its own counters) is what the one-pass curve computes for the requests it received."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hstu_replay.data.store import SequenceStore
from hstu_replay.interface import Limits
from hstu_replay.loadtest.records import read_records
from hstu_replay.analysis.cache_curve import cache_curve
from hstu_replay.plan.over_limit import KINDS
from hstu_replay.plan.timeline import build_trace, group_requests
from hstu_replay.report.natural import NATURAL_CSV, natural_section, write_natural_csv
from tests.conftest import run_distributed, run_locust, start_server, stop_server

pytestmark = pytest.mark.integration

BUDGET = 2000  # tokens: about a third of what the store's users need at once


def _server_counters(url: str) -> dict[str, int]:
    client = grpcclient.InferenceServerClient(url)
    try:
        clear = grpcclient.InferInput("CLEAR", [1], "INT64")
        clear.set_data_from_numpy(np.array([0], dtype=np.int64))  # 0: read, keep the cache
        result = client.infer("hstu_kvcache_control", [clear])
        return {name: int(result.as_numpy(name)[0]) for name in ("HIT_TOKENS", "COMPUTED_TOKENS", "REQUESTS")}
    finally:
        client.close()


@pytest.fixture(scope="module")
def budgeted_server(compiled_repository, tmp_path_factory):
    server = start_server(compiled_repository, tmp_path_factory.mktemp("natural") / "server.log",
                          "--cache-budget-tokens", str(BUDGET), "--page-tokens", "32")
    yield server
    assert stop_server(server) == 0


def test_the_emergent_ratio_is_the_curves_at_the_servers_budget(budgeted_server, long_store, tmp_path):
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", budgeted_server.grpc_url,
                        "--workload", "timeline", "--store", str(long_store), "--batch-sizes", "1",
                        "--arrival", "constant", "--request-rate", "25", "--stage-seconds", "12",
                        "--warmup-seconds", "2", "--max-history", "256", "--cache-budget-tokens", str(BUDGET))
    assert result.returncode == 0, result.stderr[-3000:]
    server = _server_counters(budgeted_server.grpc_url)
    sent = server["REQUESTS"]
    assert sent > 150, server
    observed = server["HIT_TOKENS"] / (server["HIT_TOKENS"] + server["COMPUTED_TOKENS"])

    # The curve of exactly the requests the server received: the trace's first `sent`.
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    bounds = group_requests(trace, 0, 1)[: sent + 1]
    curve = cache_curve(trace.cache_keys[:sent], trace.tokens[:sent], bounds)
    predicted = curve.ratio(BUDGET)
    assert 0.3 < predicted < 0.95  # the budget matters: neither everything nor nothing fits
    assert observed == pytest.approx(predicted, abs=0.02), (observed, predicted)

    # The report's figures are the server's word, request by request.
    report = result.report
    (stage,) = report["stages"]
    assert stage["name"] == "b1_natural" and stage["target_ratio"] is None and stage["hit_source"] == "observed"
    assert not [f for f in stage["flags"] if f["flag"] == "off-target"]
    records = [r for r in read_records(tmp_path) if r["kind"] in ("measure", "warmup")]
    assert len(records) == sent and all(r["ok"] for r in records)
    assert sum(r["observed_hits"] for r in records) == server["HIT_TOKENS"]
    natural = report["natural"]
    measured = [r for r in records if r["kind"] == "measure"]
    assert natural["requests"] == len(measured) == stage["requests"]
    assert natural["hit_ratio"] == pytest.approx(sum(r["observed_hits"] for r in measured)
                                                 / sum(r["tokens"] for r in measured))
    assert sum(b["requests"] for b in natural["by_ratio"]) == len(measured)
    assert sum(w["requests"] for w in natural["over_time"]) == sent
    assert (tmp_path / "natural_requests.csv").read_text().count("\n") == sent + 1  # header + every request
    assert "Natural replay" in (tmp_path / "report.html").read_text()
    # Every visit of the log accounted under the default --over-limit skip: the log ran out, so the
    # requests sent name every replayed visit, and the skipped ones with them.
    assert sent == len(trace)
    kinds = natural["visit_kinds"]
    assert kinds["over_limit"] == "skip" and "--over-limit skip" in (tmp_path / "report.html").read_text()
    assert tuple(kinds["kinds"][k]["visits"] for k in KINDS) == trace.accounts().visits
    assert kinds["kinds"]["skipped"]["visits"] > 0 and kinds["kinds"]["frozen"]["visits"] == 0
    assert "natural replay: over the limit: skip;" in result.stdout + result.stderr
    # Each store user kept one key for the whole run, and its visits went in the log's order.
    keys: dict[str, set] = {}
    for r in sorted(records, key=lambda r: r["t"]):
        keys.setdefault(r["label"].split(" visit")[0], set()).update(r["keys"])
    assert all(len(k) == 1 for k in keys.values())
    assert len(set().union(*keys.values())) == len(keys)


def test_bad_options_are_one_line_before_any_load(budgeted_server, long_store, tmp_path):
    for args, words in ((("--batch-sizes", "1,2"), "one batch size"),
                        (("--time-scale", "100", "--arrival", "constant", "--request-rate", "5"), "--time-scale"),
                        (("--time-scale", "-1"), "--time-scale")):
        result = run_locust(tmp_path, "-u", "1", "-r", "1", "--triton-url", budgeted_server.grpc_url,
                            "--workload", "timeline", "--store", str(long_store), "--max-history", "256",
                            "--stage-seconds", "2", *args, timeout=60)
        assert result.returncode == 2, (args, result.stderr[-1500:])
        assert words in result.stderr and "Traceback" not in result.stderr, result.stderr[-1500:]


def test_time_scale_sends_each_visit_at_its_log_time_compressed(budgeted_server, long_store, tmp_path):
    scale = 25_200.0  # 7 hours of the log a second: about 60 visits in the 6 s stage
    result = run_locust(tmp_path, "-u", "2", "-r", "2", "--triton-url", budgeted_server.grpc_url,
                        "--workload", "timeline", "--store", str(long_store), "--batch-sizes", "1",
                        "--time-scale", f"{scale:g}", "--stage-seconds", "6", "--warmup-seconds", "0",
                        "--max-history", "256", "--cache-budget-tokens", str(BUDGET))
    assert result.returncode == 0, result.stderr[-3000:]
    started = result.report["run"]["started"]
    trace = build_trace(SequenceStore.open(long_store), 16, Limits(max_history=256), 1)
    due = [(int(t) - int(trace.times_ms[0])) / 1e3 / scale for t in trace.times_ms]
    records = sorted((r for r in read_records(tmp_path) if r["kind"] == "measure"), key=lambda r: r["t"])
    assert len(records) == sum(d < 6.0 for d in due) or len(records) == sum(d < 6.0 for d in due) - 1
    for r, intended in zip(records, due):
        log_ms = int(r["label"].split("visit at ")[1].split(" ms")[0])
        assert (log_ms - int(trace.times_ms[0])) / 1e3 / scale == pytest.approx(intended)  # in the log's order
        assert r["t"] - r["lag_ms"] / 1e3 - started == pytest.approx(intended, abs=0.05)  # planned at its time
    assert sorted(r["lag_ms"] for r in records)[len(records) // 2] < 500


def test_a_distributed_natural_report_is_built_from_what_the_workers_sent(budgeted_server, long_store, tmp_path):
    """The master builds the natural section from the request rows its workers sent with their
    statistics: the same section and CSV the records files on disk give."""
    import json

    code, report_dir, log = run_distributed(
        tmp_path, "--triton-url", budgeted_server.grpc_url, "--workload", "timeline", "--store", str(long_store),
        "--batch-sizes", "1", "--arrival", "constant", "--request-rate", "20", "--stage-seconds", "6",
        "--warmup-seconds", "1", "--max-history", "256", "--cache-budget-tokens", str(BUDGET))
    assert code == 0, log[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    records = read_records(report_dir)
    assert {r["worker"] for r in records} == {0, 1}
    measured = [r for r in records if r["kind"] == "measure" and r["ok"]]
    assert report["natural"]["requests"] == len(measured) > 0
    assert [s["requests"] for s in report["stages"]] == [len(measured)]  # one stage, every worker's requests
    assert report["natural"] == json.loads(json.dumps(natural_section(records)))
    (tmp_path / "from_files").mkdir()
    assert ((report_dir / NATURAL_CSV).read_text()
            == write_natural_csv(records, tmp_path / "from_files").read_text())
