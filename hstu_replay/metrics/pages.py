"""Prometheus `/metrics` of Triton (and of our target's KV cache), scraped around a capacity step or a
load test's stage window.

The text exposition format (`name{label="value",...} value [timestamp]`) is read by
prometheus_client's parser; each sample is kept by its own name (a counter's `_total` included),
its labels and its value. Counters are compared between the scrape before a step and the one
after; gauges are averaged over scrapes taken while the step runs. The deltas cover the whole
step (priming, warm-up and measured requests alike).
"""

from __future__ import annotations

import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from hstu_replay.errors import ConfigError

SCRAPE_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 16 << 20  # a Triton with many models writes well under 1 MiB

#: Triton's per-model cumulative counters: report key -> metric name
TRITON_COUNTERS: dict[str, str] = {
    "request_success": "nv_inference_request_success",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_input_us": "nv_inference_compute_input_duration_us",
    "compute_infer_us": "nv_inference_compute_infer_duration_us",
    "compute_output_us": "nv_inference_compute_output_duration_us",
}
#: the phases averaged per successful request
PHASES = ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")
#: server-wide gauges recorded when present: report key -> metric name (mean over GPUs)
GAUGES: dict[str, str] = {
    "gpu_utilization": "nv_gpu_utilization",
    "cpu_utilization": "nv_cpu_utilization",
}
#: our target's KV-cache counters (`server serve --cache-metrics-port`)
CACHE_COUNTERS: dict[str, str] = {
    "hit_tokens": "hstu_kvcache_hit_tokens_total",
    "computed_tokens": "hstu_kvcache_computed_tokens_total",
    "evicted_users": "hstu_kvcache_evicted_users_total",
    "requests": "hstu_kvcache_requests_total",
}
CACHE_GAUGES: dict[str, str] = {"resident_tokens": "hstu_kvcache_resident_tokens"}
#: the reference server's own addresses, as labels of one constant gauge on its KV-cache page: a
#: page scraped behind a gateway says which server it belongs to
SERVER_INFO = "hstu_server_info"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str  # as the parser gives it: a counter's always ends in `_total`
    labels: Labels
    value: float
    kind: str = "untyped"  # the family's TYPE: counter, gauge, ...

    def named(self, name: str) -> bool:
        """Its name, or a counter's as its exposition wrote it (Triton's lack `_total`; the parser adds it)."""
        return self.name == name or (self.kind == "counter" and self.name == f"{name}_total")

    def matches(self, name: str, wanted: Mapping[str, str]) -> bool:
        if not self.named(name):
            return False
        have = dict(self.labels)
        return all(have.get(k) == v for k, v in wanted.items())


@dataclass(frozen=True)
class Scrape:
    samples: tuple[Sample, ...]

    def series(self, name: str, **labels: str) -> list[float]:
        return [s.value for s in self.samples if s.matches(name, labels)]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum over the matching series (e.g. every version of a model); None when there is none."""
        values = self.series(name, **labels)
        return math.fsum(values) if values else None

    def mean(self, name: str, **labels: str) -> float | None:
        values = [v for v in self.series(name, **labels) if math.isfinite(v)]
        return math.fsum(values) / len(values) if values else None


def server_address(page: Scrape) -> str | None:
    """The gRPC address a reference server's KV-cache page says it serves on (None: not said)."""
    for sample in page.samples:
        if sample.named(SERVER_INFO):
            return dict(sample.labels).get("grpc")
    return None


# -- parsing ----------------------------------------------------------------------------------

def parse(text: str) -> Scrape:
    """Every sample of a Prometheus text exposition; ValueError on a malformed line."""
    return Scrape(tuple(Sample(sample.name, tuple(sorted(sample.labels.items())), float(sample.value), family.type)
                        for family in text_string_to_metric_families(text) for sample in family.samples))


# -- scraping ---------------------------------------------------------------------------------

def metrics_url(address: str) -> str:
    """`host:port` -> `http://host:port/metrics`; a full URL is kept (with /metrics added if bare)."""
    text = address.strip()
    parts = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"metrics address {address!r}: use host:port or an http(s) URL")
    return urllib.parse.urlunsplit(parts._replace(path=parts.path if parts.path.strip("/") else "/metrics"))


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> Scrape:
    """GET and parse `url`; OSError/ValueError on an unreachable server or a malformed page."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - http(s) only
        body = response.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"{url}: more than {MAX_BODY_BYTES} bytes")
    return parse(body.decode("utf-8", errors="replace"))


def try_scrape(url: str | None, timeout_s: float = SCRAPE_TIMEOUT_S) -> Scrape | None:
    """A scrape, or None when there is no URL or it fails (a step's metrics are best effort)."""
    if not url:
        return None
    try:
        return scrape(url, timeout_s)
    except (OSError, ValueError, urllib.error.URLError):
        return None


# -- per-step figures -------------------------------------------------------------------------

def _delta(before: Scrape, after: Scrape, name: str, labels: Mapping[str, str]) -> float | None:
    """after - before of a counter; None if missing or it went down (the server restarted)."""
    a, b = after.total(name, **labels), before.total(name, **labels)
    if a is None or b is None or a < b:
        return None
    return a - b


def triton_delta(before: Scrape, after: Scrape, model: str) -> dict:
    """The model's counters over the step, and mean microseconds per successful request."""
    labels = {"model": model}
    counts = {key: _delta(before, after, name, labels) for key, name in TRITON_COUNTERS.items()}
    success = counts["request_success"]
    out: dict = {"request_success": None if success is None else int(success)}
    for phase in PHASES:
        total = counts[phase]
        out[f"mean_{phase}"] = total / success if total is not None and success else None
    compute = [out[f"mean_{p}"] for p in PHASES if p != "queue_us"]
    out["mean_compute_us"] = math.fsum(compute) if all(c is not None for c in compute) else None
    return out


def cache_delta(before: Scrape, after: Scrape) -> dict:
    """Our target's KV-cache counters over the step, the hit ratio of their tokens and residency."""
    out: dict = {}
    for key, name in CACHE_COUNTERS.items():
        d = _delta(before, after, name, {})
        out[key] = None if d is None else int(d)
    hit, computed = out["hit_tokens"], out["computed_tokens"]
    known = hit is not None and computed is not None and hit + computed > 0
    out["token_hit_ratio"] = hit / (hit + computed) if known else None
    for key, name in CACHE_GAUGES.items():
        out[key] = after.total(name)
    return out


def gauge_means(samples: Sequence[Scrape]) -> dict:
    """Each gauge averaged over GPUs within a scrape, then over the scrapes; absent gauges left out."""
    out = {}
    for key, name in GAUGES.items():
        values = [v for v in (s.mean(name) for s in samples) if v is not None]
        if values:
            out[key] = math.fsum(values) / len(values)
    return out


def step_metrics(before: Scrape | None, after: Scrape | None, during: Iterable[Scrape], model: str,
                 cache_before: Scrape | None = None, cache_after: Scrape | None = None) -> dict | None:
    """Everything recorded for a step; None when neither endpoint was scraped."""
    during = [s for s in during if s is not None]
    out: dict = {}
    if before is not None and after is not None:
        out["triton"] = triton_delta(before, after, model)
        out["triton"].update(gauge_means(during or [after]))
    if cache_before is not None and cache_after is not None:
        out["cache"] = cache_delta(cache_before, cache_after)
    return out or None
