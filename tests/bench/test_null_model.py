"""bench.null_model's Python-backend frontend: a real tritonserver answering zeros of the right shape."""

from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient

from bench import harness
from hstu_replay.interface import KVCACHE
from tests.conftest import wait_until
from tests.server.test_serve import infer, user


@pytest.mark.integration  # starts the bundled tritonserver with two backend stubs (about 10 s)
def test_the_python_backend_null_model_answers_zeros_and_counts_them(tmp_path):
    server = harness.start_null(KVCACHE, tmp_path / "server.log", instances=2, extra=("--frontend", "python-backend"))
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        config = client.get_model_config(KVCACHE.model_name, as_json=True)["config"]
        assert config["backend"] == "python" and config["instance_group"][0]["count"] == 2
        for n in (1, 3):
            logits, ints = infer(client, KVCACHE.model_name, [user(u, 20, cand=5) for u in range(n)],
                                 outputs=("OUTPUT__0", "OUTPUT__1"))
            assert logits.shape == (5 * n, 8) and not logits.any()
            assert ints.shape == (n,) and not ints.any()
        # the server's own count, open without a token; Triton records a request once its answer is
        # sent, so the count may trail the answer the client already has by a moment
        wait_until(lambda: harness.successes(server, KVCACHE.model_name) >= 2, 10, "the server to count 2 requests")
        assert harness.successes(server, KVCACHE.model_name) == 2
        client.close()
    finally:
        teardown = server.stop()
    assert teardown.clean, teardown
