"""TLS and a required header against a real tritonserver that demands them: gRPC TLS is
tritonserver's own, HTTPS is the target's TLS-terminating forwarder in front of Triton's HTTP
port, and the header is checked by Triton's restricted-API rule. Our transports must get the
same answers as NVIDIA's tritonclient over the same secured connections, and every refusal must
be one line that says what to fix."""

from __future__ import annotations

import numpy as np
import pytest

from hstu_replay.client.triton import ClientOptions, TritonClient
from hstu_replay.errors import AccessDenied, ServerError
from hstu_replay.interface import KVCACHE
from tests.certs import SENTINEL, SecureServer
from tests.client.test_triton import KINDS, rekeyed, sample_request
from tests.client.test_triton import tritonclient_logits

pytestmark = pytest.mark.integration
PROTOCOLS = list(KINDS)  # grpc (h2), grpc-grpcio, http


def _client(secure: SecureServer, kind: str, host: str = "127.0.0.1", **options) -> TritonClient:
    protocol, transport = KINDS[kind]
    port = secure.url(protocol).rpartition(":")[2]
    defaults = {"ssl": True, "root_certificates": str(secure.certs.ca), "headers": secure.headers(protocol)}
    return TritonClient(ClientOptions(url=f"{host}:{port}", protocol=protocol, grpc_transport=transport, timeout_s=20,
                                      **(defaults | options)))


def tls_tritonclient_logits(secure: SecureServer, protocol: str, request) -> np.ndarray:
    """The same request through NVIDIA's tritonclient, over TLS with the CA and the header."""
    if protocol == "grpc":
        import tritonclient.grpc as module

        options = {"ssl": True, "root_certificates": str(secure.certs.ca)}
        return tritonclient_logits(module, secure.grpc_url, request, secure.headers(protocol), **options)
    import tritonclient.http as module

    options = {"ssl": True, "ssl_options": {"ca_certs": str(secure.certs.ca)}}
    return tritonclient_logits(module, secure.https_url, request, secure.headers(protocol), **options)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])  # the certificate names both
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_our_transport_and_tritonclient_get_the_same_answers_through_tls(secure, protocol, host):
    ours = _client(secure, protocol, host)
    try:
        assert ours.connect().interface is KVCACHE
        first = 100 * PROTOCOLS.index(protocol) + (10 if host == "localhost" else 0)  # keys of its own
        for seed in range(first, first + 3):  # batch 8, long histories: many buffers, each through TLS
            request = sample_request(seed, batch=8, history=240)
            theirs = tls_tritonclient_logits(secure, KINDS[protocol][0], rekeyed(request, 50_000))
            response = ours.infer(request)
            assert response.logits.shape == (request.num_logits, 8)
            np.testing.assert_array_equal(response.logits, theirs)
            assert response.cached_tokens.tolist() == [0] * 8  # fresh keys: nothing reused
    finally:
        ours.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("ca", ["none", "other"])
def test_a_client_without_the_servers_ca_fails_in_one_line_that_says_so(secure, protocol, ca):
    client = _client(secure, protocol, root_certificates=str(secure.certs.other_ca) if ca == "other" else None)
    try:
        with pytest.raises(ServerError) as caught:
            client.connect()
    finally:
        client.close()
    message = str(caught.value)
    assert "\n" not in message
    assert "certificate verify failed" in message.lower() or "CERTIFICATE_VERIFY_FAILED" in message
    assert ("not signed by a CA in --triton-root-cert" if ca == "other" else "give the CA") in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_plain_client_at_a_tls_port_is_told_to_use_tls(secure, protocol):
    client = _client(secure, protocol, ssl=False, root_certificates=None)
    try:
        with pytest.raises(ServerError, match=r"--triton-ssl"):
            client.connect()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("header", ["missing", "wrong"])
def test_inference_without_the_right_header_is_the_servers_refusal_before_any_load(secure, protocol, header):
    headers = {} if header == "missing" else secure.headers(KINDS[protocol][0], value="not-the-value")
    client = _client(secure, protocol, headers=headers)
    try:
        with pytest.raises(AccessDenied) as caught:
            client.connect()  # metadata is open; the check is an inference without inputs
        message = str(caught.value)
        assert "\n" not in message and "check --triton-headers" in message
        assert ("HTTP 403: This API is restricted" if protocol == "http" else "This protocol is restricted") in message
        assert "x-api-key" in message and SENTINEL not in message
        # a real request is refused the same way, and not mistaken for a server that is down
        from hstu_replay.client.triton import ModelBinding

        client.binding = ModelBinding(KVCACHE, reports_hits=True)
        with pytest.raises(AccessDenied, match="restricted"):
            client.infer(sample_request(seed=30))
    finally:
        client.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_header_names_are_sent_in_lower_case(secure, protocol):
    # gRPC refuses metadata keys with capitals; HTTP header names are case-insensitive
    upper = {name.title(): value for name, value in secure.headers(KINDS[protocol][0]).items()}
    client = _client(secure, protocol, headers=upper)
    try:
        client.connect()
        assert client.infer(sample_request(seed=40)).logits.shape[1] == 8
    finally:
        client.close()


def test_tritons_own_http_port_requires_the_header_too(secure):
    import tritonclient.http

    client = tritonclient.http.InferenceServerClient(secure.handle.http_url)
    try:
        request = sample_request(seed=50)
        inputs = []
        for name, array in request.inputs(KVCACHE).items():
            item = tritonclient.http.InferInput(name, list(array.shape), "INT64")
            item.set_data_from_numpy(np.ascontiguousarray(array))
            inputs.append(item)
        with pytest.raises(Exception, match="restricted"):
            client.infer(KVCACHE.model_name, inputs)
        answer = client.infer(KVCACHE.model_name, inputs, headers=secure.headers("http"))
        assert answer.as_numpy("OUTPUT__0").shape == (request.num_logits, 8)
    finally:
        client.close()
