"""The target's cache-metrics port (prometheus_client's exposition of the cache's counters): what a
scraper reads there, with the library's parser and without it, and what capacity makes of it."""

from __future__ import annotations

import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hstu_replay.metrics import pages as metrics
from hstu_replay.server.serve import CACHE_METRICS, ServeOptions, start_cache_metrics
from tests.exposition import exposed

#: one value per figure, each different; one above 2**32, one negative (an unbounded budget)
STATS = {"hit_tokens": 66, "computed_tokens": 40, "evicted_users": 3, "requests": 2, "host_hit_tokens": 16,
         "onboarded_bytes": 123_456_789_012, "onboard_micros": 950, "offloaded_bytes": 4096, "offload_micros": 71,
         "host_evicted_users": 1, "resident_tokens": 106, "host_resident_tokens": 32, "gpu_budget_tokens": -1,
         "host_budget_tokens": 96, "resident_bytes": 217_088, "budget_bytes": 1_048_576,
         "host_resident_bytes": 65_536, "host_budget_bytes": 196_608}


class Cache:
    """Stands in for the engine's cache: the figures its `stats()` reports, set by the test."""

    def __init__(self, stats: dict[str, int]):
        self.figures = dict(stats)

    def stats(self) -> dict[str, int]:
        return dict(self.figures)


@pytest.fixture
def page():
    cache = Cache(STATS)
    server = start_cache_metrics(SimpleNamespace(cache=cache), ServeOptions(cache_metrics_port=0))
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"

    def read() -> str:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    yield cache, read
    server.shutdown()
    server.server_close()


def test_the_figures_cover_every_published_metric():
    assert set(STATS) == {key for key, _, _ in CACHE_METRICS}


def test_the_page_holds_each_figure_under_its_published_name(page):
    _, read = page
    expected = {f"hstu_kvcache_{key}" + ("_total" if kind == "counter" else ""): float(STATS[key])
                for key, kind, _ in CACHE_METRICS}
    info = f'{metrics.SERVER_INFO}{{grpc="127.0.0.1:8001",http="127.0.0.1:8000"}}'
    assert exposed(read()) == {**expected, info: 1.0}
    # the page names its server: ServeOptions' defaults, gRPC 8001 on 127.0.0.1
    assert metrics.server_address(metrics.parse(read())) == "127.0.0.1:8001"
    assert exposed(read())["hstu_kvcache_onboarded_bytes_total"] == 123_456_789_012  # exact past 2**32


def test_the_page_parses_with_prometheus_client_with_types_and_help(page):
    _, read = page
    families = {family.name: family for family in text_string_to_metric_families(read())}
    for key, kind, help_text in CACHE_METRICS:
        family = families[f"hstu_kvcache_{key}"]  # the parser names a counter without its `_total`
        assert (family.type, family.documentation) == (kind, help_text)
        (sample,) = family.samples
        assert sample.name == f"hstu_kvcache_{key}" + ("_total" if kind == "counter" else "")
        assert (sample.labels, sample.value) == ({}, STATS[key])
    info = families[metrics.SERVER_INFO]
    assert [(s.labels, s.value) for s in info.samples] == [({"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}, 1)]
    assert len(families) == len(CACHE_METRICS) + 1


def test_capacity_reads_the_counters_moving_between_two_scrapes(page):
    cache, read = page
    before = metrics.parse(read())
    cache.figures.update(hit_tokens=66 + 900, computed_tokens=40 + 300, requests=2 + 30, resident_tokens=5000)
    after = metrics.parse(read())
    assert metrics.cache_delta(before, after) == {
        "hit_tokens": 900, "computed_tokens": 300, "evicted_users": 0, "requests": 30,
        "token_hit_ratio": pytest.approx(0.75), "resident_tokens": 5000.0}  # 900 / (900 + 300)
