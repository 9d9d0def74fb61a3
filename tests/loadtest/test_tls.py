"""Real headless Locust runs through TLS and a required header, for gRPC and HTTPS, against the
reference target serving with both: every answer verified, the header's value in no file the
run or the server wrote; a missing CA or header stops the run before load, in one line."""

from __future__ import annotations

import pytest

from tests.certs import SENTINEL, SecureServer
from tests.conftest import run_locust

pytestmark = pytest.mark.integration
PROTOCOLS = ["grpc", "grpc-grpcio", "http"]  # gRPC through each --triton-grpc-transport
SWEEP = ("-u", "2", "-r", "2", "--workload", "dumps", "--hit-ratios", "0,1.0", "--batch-sizes", "4",
         "--stage-seconds", "3", "--warmup-seconds", "0", "--max-history", "256",
         # what these runs check is TLS, the header and verification: a stage left thin or client-bound by a
         # busy 2-core machine is not their failure (tests/report/test_flags.py checks those flags)
         "--min-stage-requests", "1", "--max-loop-lag-ms", "60000")


def _args(secure: SecureServer, kind: str, reference_dumps, ca: str | None, headers: dict[str, str],
          scheme: bool = False) -> list[str]:
    """The address as Locust's --host with a TLS scheme, or as --triton-url with --triton-ssl."""
    protocol, _, transport = kind.partition("-")
    address = (["--host", f"{'grpcs' if protocol == 'grpc' else 'https'}://{secure.url(protocol)}"] if scheme
               else ["--triton-url", secure.url(protocol), "--triton-protocol", protocol, "--triton-ssl"])
    args = [*address, "--dump-dir", str(reference_dumps), *SWEEP]
    if transport:
        args += ["--triton-grpc-transport", transport]
    if ca:
        args += ["--triton-root-cert", ca]
    if headers:
        args += ["--triton-headers", ",".join(f"{k}={v}" for k, v in headers.items())]
    return args


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_run_through_tls_and_a_required_header_verifies_every_answer(secure, protocol, reference_dumps, tmp_path):
    report_dir = tmp_path / "report"
    kind, protocol = protocol, protocol.partition("-")[0]
    result = run_locust(report_dir, *_args(secure, kind, reference_dumps, str(secure.certs.ca),
                                           secure.headers(protocol), scheme=True),
                        "--max-mismatches", "0", "--max-error-ratio", "0")
    assert result.returncode == 0, result.stderr[-3000:]
    report = result.report
    assert report["verification"]["mismatches"] == 0 and report["verification"]["verified"] > 0
    assert report["errors"] == {}
    assert (report["run"]["url"], report["run"]["protocol"]) == (secure.url(protocol), protocol)
    assert all(b["requests"] > 0 for b in report["bins"])
    # the server's own word on the hits: it answered these requests (through TLS, with the header)
    assert [s["hit_source"] for s in report["stages"]] == ["observed", "observed"]
    assert report["stages"][-1]["achieved_ratio"] > 0.9
    written = [p for p in report_dir.rglob("*") if p.is_file()]
    assert any(p.name == "report.json" for p in written) and any(p.name.startswith("records-") for p in written)
    for text in [result.stdout, result.stderr, secure.handle.log.read_text(errors="replace"),
                 *(p.read_bytes().decode("latin-1") for p in written)]:
        assert SENTINEL not in text


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("missing", ["ca", "header"])
def test_a_missing_ca_or_header_stops_the_run_before_load_in_one_line(secure, protocol, missing, reference_dumps,
                                                                     tmp_path):
    ca = None if missing == "ca" else str(secure.certs.ca)
    headers = {} if missing == "header" else secure.headers(protocol.partition("-")[0])
    result = run_locust(tmp_path / "report", *_args(secure, protocol, reference_dumps, ca, headers), timeout=90)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hstu-replay: error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    expected = "give the CA that signed the server's certificate" if missing == "ca" else "check --triton-headers"
    assert expected in lines[0]
    assert not (tmp_path / "report" / "report.json").exists()  # stopped before any load
    assert SENTINEL not in result.stdout + result.stderr


def test_a_distributed_run_through_https_with_each_process_holding_its_header(secure, reference_dumps, tmp_path,
                                                                             monkeypatch):
    # the header is a secret: a master sends it to no worker, so each process reads its own
    # (here from the environment, as a deployment would give it)
    from tests.conftest import run_distributed

    monkeypatch.setenv("LOCUST_TRITON_HEADERS", ",".join(f"{k}={v}" for k, v in secure.headers("http").items()))
    code, report_dir, master_log = run_distributed(
        tmp_path, *_args(secure, "http", reference_dumps, str(secure.certs.ca), {}, scheme=True),
        "--max-mismatches", "0", "--max-error-ratio", "0", users=2, workers=2)
    assert code == 0, master_log[-3000:]
    import json

    report = json.loads((report_dir / "report.json").read_text())
    assert report["run"]["workers"] == 2
    assert report["verification"]["mismatches"] == 0 and report["verification"]["verified"] > 0
    assert report["errors"] == {}
    for path in [*tmp_path.glob("*.log"), *(p for p in report_dir.rglob("*") if p.is_file())]:
        assert SENTINEL not in path.read_bytes().decode("latin-1"), path
