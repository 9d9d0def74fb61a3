"""Prometheus text parsing and per-step deltas, on a sample shaped like Triton's and our target's."""

from __future__ import annotations

import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hstu_replay.metrics import pages as metrics
from hstu_replay.errors import ConfigError

M = "hstu_gr_ranking_kvcache"

TRITON = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="hstu_gr_ranking",version="1"}} 7
nv_inference_request_success{{model="{m}",version="1"}} {success}
nv_inference_request_success{{model="{m}",version="2"}} 10
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{{model="{m}",reason="BACKEND",version="1"}} 0
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="{m}",version="1"}} {queue}
nv_inference_queue_duration_us{{model="hstu_gr_ranking",version="1"}} 999999
# TYPE nv_inference_compute_input_duration_us counter
nv_inference_compute_input_duration_us{{model="{m}",version="1"}} {cin}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="{m}",version="1"}} {cinfer}
# TYPE nv_inference_compute_output_duration_us counter
nv_inference_compute_output_duration_us{{model="{m}",version="1"}} {cout}
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="GPU-0d7a"}} {gpu0}
nv_gpu_utilization{{gpu_uuid="GPU-77c1"}} {gpu1}
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization {cpu}
nv_pinned_memory_pool_total_bytes 2.68435456e+08
"""

CACHE = """\
# HELP hstu_kvcache_hit_tokens_total History tokens reused from the KV cache
# TYPE hstu_kvcache_hit_tokens_total counter
hstu_kvcache_hit_tokens_total {hit}
# TYPE hstu_kvcache_computed_tokens_total counter
hstu_kvcache_computed_tokens_total {computed}
hstu_kvcache_evicted_users_total 0
hstu_kvcache_requests_total {requests}
# TYPE hstu_kvcache_resident_tokens gauge
hstu_kvcache_resident_tokens {resident}
"""


def triton(success=1375, queue=19847153, cin=65076, cinfer=45392896, cout=1062778, gpu0=0.5, gpu1=0.7, cpu=1):
    return metrics.parse(TRITON.format(m=M, success=success, queue=queue, cin=cin, cinfer=cinfer, cout=cout,
                                       gpu0=gpu0, gpu1=gpu1, cpu=cpu))


def cache(hit=38886, computed=92448, requests=1375, resident=92448):
    return metrics.parse(CACHE.format(hit=hit, computed=computed, requests=requests, resident=resident))


def test_samples_and_labels_are_parsed():
    scrape = triton()
    assert scrape.series("nv_inference_request_success", model=M, version="1") == [1375.0]
    assert scrape.series("nv_inference_request_failure", model=M, reason="BACKEND") == [0.0]
    assert scrape.total("nv_inference_request_success", model=M) == 1385  # both versions
    assert scrape.total("nv_inference_request_success") == 1392  # every model
    assert scrape.total("nv_inference_request_success", model="absent") is None
    assert scrape.total("nv_pinned_memory_pool_total_bytes") == 268435456
    assert scrape.mean("nv_gpu_utilization") == pytest.approx(0.6)


HAND_WORKED = """\
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="m",version="1"} 12
nv_inference_count{model="m",version="2"} 30
nv_inference_count{model="other",version="1"} 7
# TYPE hstu_kvcache_hit_tokens_total counter
hstu_kvcache_hit_tokens_total 1.5e3
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="a"} 0.25
nv_gpu_utilization{gpu_uuid="b"} 0.75
hstu_kvcache_resident_tokens 96
"""


def test_a_hand_worked_page_parses_to_its_numbers():
    scrape = metrics.parse(HAND_WORKED)
    assert scrape.series("nv_inference_count", model="m") == [12.0, 30.0]  # a counter as Triton writes it
    assert scrape.total("nv_inference_count", model="m") == 42  # 12 + 30
    assert scrape.total("nv_inference_count") == 49  # 12 + 30 + 7
    assert scrape.total("hstu_kvcache_hit_tokens_total") == 1500  # a counter written with `_total`
    assert scrape.mean("nv_gpu_utilization") == 0.5  # (0.25 + 0.75) / 2
    assert scrape.total("nv_gpu_utilization_total") is None  # only a counter answers to `_total`
    assert scrape.total("hstu_kvcache_resident_tokens") == 96  # untyped
    assert len(scrape.samples) == 7


def test_escapes_special_values_and_timestamps():
    scrape = metrics.parse(
        'odd{path="C:\\\\tmp",msg="say \\"hi\\", {ok}",nl="a\\nb"} 3 1712345678000\n'
        "  \n"
        'gap{ a="1" , b="2" ,} +Inf\n'
        "nan_metric NaN\n"
        "neg -1.5e-3\n"
    )
    (odd,) = scrape.samples[:1]
    assert dict(odd.labels) == {"path": "C:\\tmp", "msg": 'say "hi", {ok}', "nl": "a\nb"}
    assert odd.value == 3.0  # the timestamp is not the value
    assert scrape.total("gap", a="1", b="2") == math.inf
    assert math.isnan(scrape.total("nan_metric"))
    assert scrape.mean("nan_metric") is None  # NaN left out of means
    assert scrape.total("neg") == -0.0015


@pytest.mark.parametrize("line", ['broken{model="x} 1', "lonely", 'bad{model=x} 1', "name notanumber"])
def test_malformed_lines_raise_value_error(line):
    with pytest.raises(ValueError):
        metrics.parse(line + "\n")


def test_triton_deltas_per_request():
    before = triton(success=1000, queue=100_000, cin=5_000, cinfer=300_000, cout=10_000)
    after = triton(success=1200, queue=140_000, cin=5_400, cinfer=360_000, cout=11_000)
    d = metrics.triton_delta(before, after, M)
    assert d["request_success"] == 200  # the version-2 series did not move
    assert d["mean_queue_us"] == pytest.approx(200.0)  # 40,000 us / 200
    assert d["mean_compute_input_us"] == pytest.approx(2.0)
    assert d["mean_compute_infer_us"] == pytest.approx(300.0)
    assert d["mean_compute_output_us"] == pytest.approx(5.0)
    assert d["mean_compute_us"] == pytest.approx(307.0)


def test_no_requests_or_a_restarted_server_gives_no_means():
    same = metrics.triton_delta(triton(), triton(), M)
    assert same["request_success"] == 0 and same["mean_queue_us"] is None
    restarted = metrics.triton_delta(triton(success=1000), triton(success=5, queue=10), M)
    assert restarted["request_success"] is None and restarted["mean_queue_us"] is None
    assert metrics.triton_delta(triton(), triton(), "absent")["request_success"] is None


def test_cache_deltas():
    d = metrics.cache_delta(cache(hit=1000, computed=3000, requests=10),
                            cache(hit=1900, computed=3300, requests=40, resident=5000))
    assert d == {"hit_tokens": 900, "computed_tokens": 300, "evicted_users": 0, "requests": 30,
                 "token_hit_ratio": pytest.approx(0.75), "resident_tokens": 5000.0}


def test_step_metrics_average_gauges_during_the_step():
    before, after = triton(success=10), triton(success=30, gpu0=0.0, gpu1=0.0, cpu=0.1)
    during = [triton(gpu0=0.8, gpu1=0.6, cpu=0.5), triton(gpu0=0.4, gpu1=0.2, cpu=0.7)]
    out = metrics.step_metrics(before, after, during, M, cache(), cache(hit=38900))
    assert out["triton"]["request_success"] == 20
    assert out["triton"]["gpu_utilization"] == pytest.approx(0.5)  # (0.7 + 0.3) / 2
    assert out["triton"]["cpu_utilization"] == pytest.approx(0.6)
    assert out["cache"]["hit_tokens"] == 14
    # no samples during a short step: the gauges are read from the scrape after it
    assert metrics.step_metrics(before, after, [], M)["triton"]["cpu_utilization"] == pytest.approx(0.1)
    assert "gpu_utilization" not in metrics.gauge_means([metrics.parse("nv_cpu_utilization 0.5\n")])
    assert metrics.step_metrics(None, after, [], M) is None


def test_metrics_url_forms():
    assert metrics.metrics_url("127.0.0.1:8002") == "http://127.0.0.1:8002/metrics"
    assert metrics.metrics_url("http://host:8002/") == "http://host:8002/metrics"
    assert metrics.metrics_url("https://host/prom/metrics") == "https://host/prom/metrics"
    with pytest.raises(ConfigError):
        metrics.metrics_url("ftp://host/metrics")


def test_scrape_over_http():
    body = TRITON.format(m=M, success=5, queue=1, cin=1, cinfer=1, cout=1, gpu0=0, gpu1=0, cpu=0).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = metrics.metrics_url(f"127.0.0.1:{server.server_address[1]}")
        assert metrics.scrape(url).total("nv_inference_request_success", model=M) == 15
    finally:
        server.shutdown()
        server.server_close()
    assert metrics.try_scrape(url, timeout_s=1.0) is None  # gone: best effort gives None
    assert metrics.try_scrape(None) is None


def test_a_page_names_its_server_by_the_info_gauge():
    page = metrics.parse('# TYPE hstu_server_info gauge\n'
                         'hstu_server_info{grpc="127.0.0.1:9001",http="127.0.0.1:9000"} 1\n'
                         '# TYPE hstu_kvcache_requests counter\nhstu_kvcache_requests_total 3\n')
    assert metrics.server_address(page) == "127.0.0.1:9001"
    assert metrics.server_address(metrics.parse("# TYPE hstu_kvcache_requests counter\n"
                                                "hstu_kvcache_requests_total 3\n")) is None
