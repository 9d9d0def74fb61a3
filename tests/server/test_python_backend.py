"""`server serve --frontend python-backend`: the models as a Python-backend repository on a real tritonserver."""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hstu_replay.interface import CONTROL_MODEL, KVCACHE, NOCACHE, PYTHON_BACKEND
from hstu_replay.metrics import pages as metrics
from hstu_replay.server.python_backend import BackendSettings, config_text, model_entries, model_file
from hstu_replay.server.serve import CONTROL_OUTPUTS
from tests.conftest import MACHINE_LENIENT, run_locust, start_server, stop_server
from tests.exposition import exposed
from tests.server.test_serve import infer, prefix, user

SETTINGS = BackendSettings(role="cached", model="m", engine="batched", repository="/repo", config="small",
                           dtype="bfloat16", seed=3, cache_budget_tokens=4096, page_tokens=32, device="cpu",
                           host="127.0.0.1", cache_metrics_port=8003, control_socket="/tmp/x/cache.sock",
                           reserve_pool=True)


def test_the_settings_survive_the_config_text():
    entry = model_entries()[0]
    text = config_text(entry, SETTINGS)
    values = dict(re.findall(r'key: "(\w+)" value: \{ string_value: ("(?:[^"\\]|\\.)*")', text))
    assert BackendSettings.from_json(json.loads(values.pop("hstu"))) == SETTINGS
    assert 'backend: "python"' in text and "max_batch_size: 0" in text
    # the small config's limits, by hand: 8 users of 6 + 2 x (256 + 32) values each
    assert {k: json.loads(v) for k, v in values.items()} == {
        "hstu_max_batch": "8", "hstu_max_values": str(8 * (6 + 2 * (256 + 32))), "hstu_max_candidates": "32",
        "hstu_max_history_items": "256"}


def test_limits_are_left_out_where_not_published_and_of_the_control_model():
    unpublished = BackendSettings(**{**SETTINGS.__dict__, "publish_limits": False})
    assert "hstu_max" not in config_text(model_entries()[0], unpublished)
    control = next(e for e in model_entries() if e.role == "control")
    assert "hstu_max" not in config_text(control, SETTINGS)


def test_every_published_model_is_in_the_repository_with_its_tensors():
    entries = {e.name: e for e in model_entries()}
    assert set(entries) == {KVCACHE.model_name, NOCACHE.model_name, PYTHON_BACKEND.model_name, CONTROL_MODEL}
    kv = entries[KVCACHE.model_name]
    assert [t.name for t in kv.inputs] == [t.name for t in KVCACHE.inputs]
    assert [t.name for t in kv.outputs] == [t.name for t in KVCACHE.outputs] + ["CACHED_TOKENS", "HOST_CACHED_TOKENS"]
    assert [t.name for t in entries[CONTROL_MODEL].outputs] == list(CONTROL_OUTPUTS)
    assert {e.role for e in entries.values()} == {"cached", "uncached", "control"}


def test_the_model_file_puts_the_paths_first_and_imports_the_backend_model():
    text = model_file(["/a", "/b"])
    compile(text, "model.py", "exec")
    lines = text.splitlines()
    assert lines[1] == "sys.path[:0] = [p for p in ['/a', '/b'] if p not in sys.path]"
    assert lines[2].startswith("from hstu_replay.server.backend_model import TritonPythonModel")


@pytest.fixture(scope="module")
def native_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("native") / "server.log"
    server = start_server(tmp_path_factory.mktemp("unused-repository"), log, "--frontend", "python-backend",
                          "--engine", "batched", "--config", "small", "--cache-budget-tokens", "65536",
                          "--reserve-pool", ready_timeout=300)
    yield server, log
    code = stop_server(server)  # also: tritonserver, every stub and every port gone
    assert code == 0, log.read_text(errors="replace")[-2000:]


@pytest.mark.integration
def test_locust_replays_the_reference_dumps_through_the_python_backend(native_server, reference_dumps, tmp_path):
    server, _ = native_server
    result = run_locust(
        tmp_path / "report", "-u", "1", "-r", "1", "--triton-url", server.grpc_url, "--workload", "dumps",
        "--dump-dir", str(reference_dumps), "--hit-ratios", "0,0.5,1.0", "--batch-sizes", "8",
        "--stage-seconds", "3", "--warmup-seconds", "1", "--max-mismatches", "0",
        *MACHINE_LENIENT,
    )
    assert result.violations_but_the_machines() == []
    report = result.report
    # --max-history left out: the model's published limits cap it (8 users of 6 + 2 x (256 + 32) values)
    assert report["run"]["server_limits"] == {
        "published": {"max_batch": 8, "max_values": 4656, "max_candidates": 32, "max_history": 256},
        "caps": [{"option": "--max-history", "asked": 4096, "used": 256},
                 {"option": "--max-values", "asked": 40_000, "used": 4656}]}
    verification = report["verification"]
    assert verification["mismatches"] == 0  # the compiled packages' logits, from the dumps
    assert verification["verified"] == sum(b["requests"] for b in report["bins"]) > 0
    for stage in report["stages"]:
        assert stage["requests"] > 0, stage
        assert stage["hit_disagreements"] == 0, stage  # the server's CACHED_TOKENS are the client ledger's
        assert stage["observed_ratio"] == pytest.approx(stage["predicted_ratio"]), stage


@pytest.mark.integration
def test_the_control_model_reaches_the_cache_of_the_kvcache_model(native_server):
    server, _ = native_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        first = infer(client, KVCACHE.model_name, [user(31, 30, key=931_001)])
        second = infer(client, KVCACHE.model_name, [user(31, 30, key=931_001)])
        assert first[1].tolist() == [0] and second[1].tolist() == [66]  # 6 + 2 x 30 history tokens reused
        np.testing.assert_allclose(second[0], first[0], atol=0.0625)
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.cache_metrics}/metrics").read().decode()
        values = exposed(text)
        assert metrics.server_address(metrics.parse(text)) == server.grpc_url  # the page names its server
        clear = grpcclient.InferInput("CLEAR", [1], "INT64")
        clear.set_data_from_numpy(np.array([0], dtype=np.int64))
        stats = client.infer(CONTROL_MODEL, [clear])
        assert stats.as_numpy("HIT_TOKENS").tolist() == [int(values["hstu_kvcache_hit_tokens_total"])] != [0]
        # --reserve-pool: the whole pool taken at start, 2,048 pages of budget + 8 users x 17 pages, of
        # 32 tokens x K and V x 2 layers x 2 heads x 32 x fp32 (the grown pool would hold 136 pages yet)
        assert stats.as_numpy("RESIDENT_BYTES").tolist() == stats.as_numpy("BUDGET_BYTES").tolist() == \
            [(2048 + 8 * 17) * 32 * 2 * 2 * 2 * 32 * 4]
        clear.set_data_from_numpy(np.array([1], dtype=np.int64))
        assert client.infer(CONTROL_MODEL, [clear]).as_numpy("RESIDENT_TOKENS").tolist() == [0]
        third = infer(client, KVCACHE.model_name, [user(31, 30, key=931_001)])
        assert third[1].tolist() == [0]  # emptied without a restart
        plain = infer(client, NOCACHE.model_name, [user(31, 30)], outputs=("OUTPUT__0",))
        np.testing.assert_allclose(plain[0], first[0], atol=0.0625)
    finally:
        client.close()


@pytest.mark.integration
def test_a_bad_request_is_an_error_naming_it_and_the_server_stays(native_server):
    server, _ = native_server
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        infer(client, KVCACHE.model_name, [user(40, 40, key=940_000)])
        with pytest.raises(Exception, match="shorter than"):  # the server's ledger refuses a shrunk history
            infer(client, KVCACHE.model_name, [prefix(user(40, 40, key=940_000), 5)])
        assert infer(client, KVCACHE.model_name, [user(50, 5, key=950_000)])[1].tolist() == [0]
    finally:
        client.close()
