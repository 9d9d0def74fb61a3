"""The client's checks on what comes back, and its two transports against NVIDIA's own client on
a real server: the same request must give the same answer, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.client.triton import ClientOptions, TritonClient, checked_output
from hstu_replay.errors import ServerError, ServerUnavailable
from hstu_replay.interface import INTERFACES, KVCACHE, Limits
from hstu_replay.request import UserRequest, build_request


def test_an_answer_of_the_implied_shape_passes():
    logits = np.zeros((12, 8), np.float32)
    assert checked_output({"OUTPUT__0": logits}, "OUTPUT__0", (12, 8)) is logits


@pytest.mark.parametrize("outputs, message", [
    ({}, "response lacks output OUTPUT__0"),
    ({"OUTPUT__0": np.zeros((11, 8), np.float32)}, "has shape [11, 8]; the request implies [12, 8]"),
    ({"OUTPUT__0": np.zeros(96, np.float32)}, "has shape [96]"),
])
def test_a_missing_or_misshapen_output_is_a_server_error(outputs, message):
    with pytest.raises(ServerError, match=message.replace("[", r"\[").replace("]", r"\]")):
        checked_output(outputs, "OUTPUT__0", (12, 8))


def test_only_the_kvcache_model_is_treated_as_cached():
    # The Python-backend model takes user ids but keeps no cache.
    assert {name for name, i in INTERFACES.items() if i.uses_cache} == {KVCACHE.name}


#: each way of sending: (protocol, gRPC transport); the id names it
KINDS = {"grpc": ("grpc", "h2"), "grpc-grpcio": ("grpc", "grpcio"), "http": ("http", "h2")}


def kind_options(kind: str, **options) -> ClientOptions:
    protocol, transport = KINDS[kind]
    return ClientOptions(protocol=protocol, grpc_transport=transport, **options)


@pytest.mark.parametrize("kind", KINDS)
def test_nothing_listening_is_unavailable_not_a_failed_request(kind):
    from tests.conftest import free_ports

    client = TritonClient(kind_options(kind, url=f"127.0.0.1:{free_ports(1)[0]}", timeout_s=5))
    client.binding = _binding()
    try:
        with pytest.raises(ServerUnavailable):
            client.infer(sample_request(seed=1))
    finally:
        client.close()


def _binding():
    from hstu_replay.client.triton import ModelBinding

    return ModelBinding(KVCACHE, reports_hits=False)


def sample_request(seed: int, batch: int = 3, history: int = 40):
    rng = np.random.default_rng(seed)
    users = [UserRequest(100 + seed * 10 + b, tuple(int(x) for x in rng.integers(1, 5, 5)),
                         rng.integers(1, 3000, history + b), rng.integers(0, 256, history + b),
                         rng.integers(1, 3000, 4)) for b in range(batch)]
    return build_request(users, Limits(max_history=256))


def tritonclient_logits(module, url: str, request, headers: dict | None = None, **client_options) -> np.ndarray:
    """The same request through NVIDIA's tritonclient (the independent implementation)."""
    client = module.InferenceServerClient(url, **client_options)
    try:
        inputs = []
        for name, array in request.inputs(KVCACHE).items():
            item = module.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(np.ascontiguousarray(array))
            inputs.append(item)
        result = client.infer(KVCACHE.model_name, inputs, outputs=[module.InferRequestedOutput("OUTPUT__0")],
                              headers=headers)
        return result.as_numpy("OUTPUT__0")
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_our_transport_and_tritonclient_get_the_same_answer(triton_server, kind):
    import tritonclient.grpc
    import tritonclient.http

    protocol = KINDS[kind][0]
    url = triton_server.grpc_url if protocol == "grpc" else triton_server.http_url
    ours = TritonClient(kind_options(kind, url=url))
    try:
        binding = ours.connect()
        assert binding.interface is KVCACHE
        first = 10 * list(KINDS).index(kind)
        for seed in range(first, first + 3):  # fresh keys each time: no cache state shared between the two clients
            request = sample_request(seed)
            theirs = tritonclient_logits(tritonclient.grpc if protocol == "grpc" else tritonclient.http, url,
                                          rekeyed(request, 10_000))
            response = ours.infer(request)
            assert response.logits.shape == (request.num_logits, 8)
            np.testing.assert_array_equal(response.logits, theirs)
            assert 0 < response.latency_s < 60
    finally:
        ours.close()


def rekeyed(request, offset: int):
    from dataclasses import replace

    return replace(request, user_ids=request.user_ids + offset)


def test_options_send_header_names_in_lower_case_and_never_show_their_values():
    options = ClientOptions(headers={"X-Api-Key": "s3cr3t", " Authorization": "Bearer t0ken"})
    assert dict(options.headers) == {"x-api-key": "s3cr3t", "authorization": "Bearer t0ken"}
    assert "s3cr3t" not in repr(options) and "t0ken" not in repr(options) and "x-api-key" in repr(options)


def test_a_root_certificate_without_tls_is_one_line():
    from hstu_replay.errors import ConfigError

    with pytest.raises(ConfigError, match="--triton-root-cert needs TLS"):
        ClientOptions(root_certificates="ca.pem")
