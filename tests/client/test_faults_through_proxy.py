"""Both transports through the fault-injecting proxy (`fault_proxy`) to the real reference server:
a spoiled answer fails its call within a bound, no wrong answer comes back as a right one (each
answer is checked against what NVIDIA's tritonclient gets straight from the server), and once the
proxy passes traffic through cleanly the next call is served within seconds."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from hstu_replay.client.h2_grpc import H2Grpc
from hstu_replay.client.http_infer import HttpInfer
from hstu_replay.errors import ServerError
from hstu_replay.interface import NOCACHE
from tests.client.fault_proxy import Fault, FaultProxy
from tests.client.test_triton import sample_request

pytestmark = pytest.mark.integration

TIMEOUT_S = 2.0  # the clients' timeout; the proxy's stall is longer
STALL_S = 3.0
SLACK_S = 2.0  # a failed call ends within its timeout and this; a clean one within this
TRANSPORTS = {"http": (HttpInfer, "http_url"), "h2": (H2Grpc, "grpc_url")}
#: fault -> what the failed call says, by transport
NAMED = {
    Fault.RESET: {"http": "connection lost|connection closed", "h2": "UNAVAILABLE: connection lost"},
    Fault.STALL: {"http": "timed out", "h2": "DEADLINE_EXCEEDED"},
    Fault.TRUNCATE: {"http": "connection closed", "h2": "UNAVAILABLE: connection lost"},
    Fault.JUNK_BEFORE: {"http": "HTTP/1.1 protocol error: (the status line is not|the response does not start with)",
                        "h2": "FRAME_SIZE_ERROR"},
    Fault.JUNK_INSIDE: {"http": "HTTP/1.1 protocol error|malformed inference response", "h2": "INTERNAL|DEADLINE"},
    Fault.H2_OVERSIZE: {"h2": "FRAME_SIZE_ERROR: a frame of 16385 bytes"},
}
CASES = [(t, f) for f, named in NAMED.items() for t in named]


@pytest.fixture(scope="module")
def references(triton_server):
    """Requests of the uncached model (no cache state between calls) and the logits NVIDIA's
    tritonclient gets for them straight from the server."""
    import tritonclient.http

    client = tritonclient.http.InferenceServerClient(triton_server.http_url)
    out = []
    try:
        for seed in range(6):
            request = sample_request(seed)
            inputs = []
            for name, array in request.inputs(NOCACHE).items():
                item = tritonclient.http.InferInput(name, list(array.shape), "INT64")
                item.set_data_from_numpy(np.ascontiguousarray(array))
                inputs.append(item)
            result = client.infer(NOCACHE.model_name, inputs)
            out.append((request, result.as_numpy(NOCACHE.logits_output)))
    finally:
        client.close()
    return out


def through(proxy: FaultProxy, transport: str):
    kind, _ = TRANSPORTS[transport]
    return kind("127.0.0.1", proxy.port, NOCACHE.model_name, {}, TIMEOUT_S)


def upstream(triton_server, transport: str) -> tuple[str, int]:
    host, port = getattr(triton_server, TRANSPORTS[transport][1]).rsplit(":", 1)
    return host, int(port)


def call(client, request) -> np.ndarray:
    outputs, _ = client.infer(request.input_parts(NOCACHE), (NOCACHE.logits_output,))
    return outputs[NOCACHE.logits_output]


@pytest.mark.parametrize("transport, fault", CASES, ids=[f"{t}-{f.value}" for t, f in CASES])
def test_a_spoiled_answer_fails_its_call_by_name_and_the_next_call_is_served(triton_server, references,
                                                                             transport, fault):
    proxy = FaultProxy(upstream(triton_server, transport), transport == "h2", stall_s=STALL_S)
    client = through(proxy, transport)
    try:
        (first, first_logits), (second, _), (third, third_logits) = references[:3]
        np.testing.assert_array_equal(call(client, first), first_logits)  # clean, through the proxy
        proxy.arm(fault)
        start = time.monotonic()
        with pytest.raises(ServerError, match=NAMED[fault][transport]):
            call(client, second)
        assert time.monotonic() - start < TIMEOUT_S + SLACK_S
        assert proxy.injected == [fault]
        start = time.monotonic()
        np.testing.assert_array_equal(call(client, third), third_logits)
        assert time.monotonic() - start < SLACK_S
    finally:
        client.close()
        proxy.close()


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_faults_among_clean_answers_are_each_one_failure_and_no_answer_is_wrong(triton_server, references, transport):
    """Every third call's answer spoiled, cycling through the faults the transport meets: each call
    either fails or returns exactly the reference; failures are as many as faults; then clean."""
    faults = [f for f, named in NAMED.items() if transport in named]
    proxy = FaultProxy(upstream(triton_server, transport), transport == "h2", stall_s=STALL_S)
    client = through(proxy, transport)
    failures, served = [], 0
    deadline = time.monotonic() + 3 * len(faults) * (TIMEOUT_S + SLACK_S)
    try:
        call(client, references[0][0])  # connected, settings exchanged: each answer below is one call's
        for i in range(3 * len(faults)):
            request, logits = references[i % len(references)]
            if i % 3 == 2:
                proxy.arm(faults[i // 3])
            try:
                answer = call(client, request)
            except ServerError as exc:
                failures.append(str(exc))
                continue
            np.testing.assert_array_equal(answer, logits)  # no wrong answer passes as a right one
            served += 1
        assert time.monotonic() < deadline
        assert proxy.injected == faults and len(failures) == len(faults), (proxy.injected, failures)
        for fault, failure in zip(faults, failures):
            assert re.search(NAMED[fault][transport], failure), (fault, failure)
        assert served == 2 * len(faults)
        proxy.clean()
        for request, logits in references:
            np.testing.assert_array_equal(call(client, request), logits)
    finally:
        client.close()
        proxy.close()


@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_a_verified_locust_run_through_faults_counts_each_and_serves_again(triton_server, reference_dumps,
                                                                            tmp_path, transport):
    """A real headless Locust run of the dumps workload (every answer verified) through the proxy:
    once it is sending, every third answer is spoiled, one of each fault, then traffic passes
    cleanly. The run ends by itself; each fault is a failure named by the transport, none is a
    wrong answer, and requests succeed again within seconds of the proxy turning clean."""
    import subprocess

    from hstu_replay.loadtest.records import read_records
    from tests.conftest import ROOT, locust_command, wait_until

    faults = [f for f, named in NAMED.items() if transport in named]
    protocol = ["--triton-protocol", "http"] if transport == "http" else ["--triton-grpc-transport", "h2"]
    proxy = FaultProxy(upstream(triton_server, transport), transport == "h2", stall_s=STALL_S)
    report_dir = tmp_path / "report"
    run = subprocess.Popen(
        locust_command("--headless", "--only-summary", "--loglevel", "WARNING", "-u", "1", "-r", "1",
                       "--report-dir", str(report_dir), "--triton-url", proxy.address, *protocol,
                       "--triton-timeout", str(TIMEOUT_S), "--workload", "dumps", "--dump-dir", str(reference_dumps),
                       "--hit-ratios", "0.5", "--batch-sizes", "8", "--stage-seconds", "25", "--warmup-seconds", "0",
                       "--max-history", "256"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        # no warm-up: the statistics poll as the measured window opens (through the proxy too) comes
        # before the 30th answer, so no fault spoils it instead of an inference answer
        wait_until(lambda: proxy.answers >= 30, 120, "the run to send through the proxy")
        proxy.arm_every(3, faults)
        wait_until(lambda: len(proxy.injected) == len(faults), 60, "every fault to be put in")
        cleaned = time.time()  # the proxy passes everything through from here
        _, err = run.communicate(timeout=120)  # the run ends by itself
    finally:
        if run.poll() is None:
            run.kill()
        proxy.close()
    assert "Traceback" not in err, err[-3000:]
    assert run.returncode == 1, err[-2000:]  # failures, no thresholds: Locust's error exit code
    import json

    report = json.loads((report_dir / "report.json").read_text())
    assert sum(b["mismatches"] for b in report["bins"]) == 0 and report["verification"]["verified"] > 0
    records = read_records(report_dir)  # every request sent (warm-up, priming and measured alike)
    failed = [r["error"] for r in records if not r["ok"] and r["error"] != "not sent: its priming request failed"]
    assert proxy.injected == faults and len(failed) >= len(faults), (proxy.injected, failed)
    named = "|".join(NAMED[f][transport] for f in faults)
    assert all(re.search(named, error) for error in failed), failed
    assert not any(r.get("mismatch") for r in records)  # no answer came back wrong, checked or not
    after = sorted(r["t"] for r in records if r["ok"] and r["t"] >= cleaned)
    assert after and after[0] - cleaned < SLACK_S + TIMEOUT_S, (after[:3], cleaned)
